"""The disk reserve (streams/disk_reserve.py) on its own; tests/broker/test_disk_full.py
runs it on a real full tmpfs through a broker."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from npstream.broker.errors import DiskFullError
from npstream.broker.streams.disk_reserve import RESERVE_FILE, DiskReserve


def test_ensure_makes_an_allocated_file_of_the_reserve_size(tmp_path: Path) -> None:
    reserve = DiskReserve(tmp_path, size=64 << 10)
    assert reserve.ensure() is True
    path = tmp_path / RESERVE_FILE
    assert path.stat().st_size == 64 << 10
    assert path.stat().st_blocks * 512 >= 64 << 10  # allocated, not a sparse file
    assert reserve.ensure() is True  # kept as it is


def test_ensure_with_less_than_twice_the_reserve_free_makes_nothing(tmp_path: Path) -> None:
    stats = os.statvfs(tmp_path)
    reserve = DiskReserve(tmp_path, size=stats.f_bavail * stats.f_frsize)  # half is missing
    assert reserve.ensure() is False
    assert not (tmp_path / RESERVE_FILE).exists()


def test_freeing_a_full_disk_releases_the_reserve_and_runs_again(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture,
                                                                 ) -> None:
    reserve = DiskReserve(tmp_path, size=4096)
    reserve.ensure()
    calls: list[bool] = []

    def operation() -> str:
        calls.append((tmp_path / RESERVE_FILE).exists())
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return "done"

    assert reserve.freeing("orders", "delete_messages", operation) == "done"
    assert calls == [True, False]  # the second run had the reserve's room
    assert (tmp_path / RESERVE_FILE).exists()  # taken back: there is room
    assert "released the 4096-byte disk reserve so that delete_messages of stream " \
           "'orders' can run" in caplog.text


def test_freeing_without_a_reserve_or_for_another_error_runs_once(tmp_path: Path) -> None:
    reserve = DiskReserve(tmp_path, size=4096)  # never made
    calls: list[int] = []

    def full() -> None:
        calls.append(1)
        raise DiskFullError("orders", "delete_messages", "[Errno 28] No space left on device")

    with pytest.raises(DiskFullError):
        reserve.freeing("orders", "delete_messages", full)
    reserve.ensure()

    def broken() -> None:
        calls.append(2)
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(OSError, match="Input/output error"):
        reserve.freeing("orders", "delete_messages", broken)
    assert calls == [1, 2]
    assert (tmp_path / RESERVE_FILE).exists()  # not released for an I/O error

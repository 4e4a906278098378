"""How many bytes a read of stored batches takes from the file: about what it returns.

A read with a large byte limit over large frames used to pread up to the
limit past what it returned, then the next frame whole, only to find it over
the limit (a shared group's 16 MiB read-ahead over 10 MB frames read 3.2
bytes per byte returned). Frames of LARGE_FRAME_BYTES or more are now read
alone, and a frame over the limit is not read at all.
"""

from __future__ import annotations

import os

import pytest

from npstream.broker.errors import CorruptRecordError
from npstream.broker.storage.tuning import LARGE_FRAME_BYTES
from npstream.proto.frames import reader as frame_reader
from npstream.proto.frames.payload import decode_payload


@pytest.fixture
def pread_bytes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes returned by every os.pread of the frame reader during the test."""
    sizes: list[int] = []
    real = os.pread

    def pread(fd: int, size: int, position: int) -> bytes:
        data = real(fd, size, position)
        sizes.append(len(data))
        return data

    monkeypatch.setattr(frame_reader.os, "pread", pread)
    return sizes


def big_frames_log(make_storage, config, table_of, frames: int, rows: int, size: int):
    storage = make_storage(segment_bytes=64 << 20)
    log = storage.open_log("big", config)
    for frame in range(frames):
        log.append(table_of([bytes([frame]) * size for _ in range(rows)]))
    return log


def offsets(result) -> list[int]:
    return [o for payload in result.batches
            for o in decode_payload(payload).column("offset").to_pylist()]


@pytest.mark.parametrize("whole", [False, True])
def test_a_read_of_large_frames_reads_what_it_returns(make_storage, config, table_of,
                                                      pread_bytes, whole):
    log = big_frames_log(make_storage, config, table_of, frames=4, rows=1000, size=1000)
    frame = sum(len(p) for p in log.read(0, max_messages=1000, max_bytes=16 << 20).batches)
    assert frame > LARGE_FRAME_BYTES
    pread_bytes.clear()
    # A limit of 1.6 frames: one frame back, the second one is over it and not read.
    result = log.read(0, max_messages=100_000, max_bytes=frame * 16 // 10, whole=whole)
    assert offsets(result) == list(range(1000)) and result.next_offset == 1000
    assert sum(pread_bytes) < frame + LARGE_FRAME_BYTES + 1024
    pread_bytes.clear()
    result = log.read(1000, max_messages=100_000, max_bytes=16 << 20, whole=whole)
    assert offsets(result) == list(range(1000, 4000))
    assert sum(pread_bytes) < 3 * frame + LARGE_FRAME_BYTES + 1024


def test_a_read_ending_inside_a_frame_still_cuts_it(make_storage, config, table_of, pread_bytes):
    log = big_frames_log(make_storage, config, table_of, frames=3, rows=1000, size=1000)
    result = log.read(500, max_messages=1000, max_bytes=16 << 20)
    assert offsets(result) == list(range(500, 1500))
    result = log.read(0, max_messages=100_000, max_bytes=16 << 20, end_offset=1200)
    assert offsets(result) == list(range(1200))  # the frame cut at the end is read, not refused


def test_small_frames_are_still_read_many_per_pread(make_storage, config, table_of, pread_bytes):
    storage = make_storage(segment_bytes=64 << 20)
    log = storage.open_log("small", config)
    for i in range(200):
        log.append(table_of([b"%d" % i * 50]))
    pread_bytes.clear()
    result = log.read(0, max_messages=1000, max_bytes=16 << 20)
    assert offsets(result) == list(range(200))
    assert len(pread_bytes) == 1


def test_a_frame_past_the_limit_is_not_read_so_its_damage_is_not_this_reads(
        make_storage, config, table_of, data_dir):
    log = big_frames_log(make_storage, config, table_of, frames=2, rows=1000, size=1000)
    frame = sum(len(p) for p in log.read(0, max_messages=1000, max_bytes=16 << 20).batches)
    path = next((data_dir / "streams" / "big").glob("*.log"))
    with open(path, "r+b") as file:  # a byte of the second frame's payload
        file.seek(path.stat().st_size - 100)
        file.write(b"\xff" if file.read(1) != b"\xff" else b"\x00")
    assert offsets(log.read(0, max_messages=100_000, max_bytes=frame + 10)) == list(range(1000))
    with pytest.raises(CorruptRecordError):
        log.read(0, max_messages=100_000, max_bytes=16 << 20)

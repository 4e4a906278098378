"""Open file descriptors stay under max_open_files, however many streams are used."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npstream.broker.storage import AckMode
from npstream.broker.storage.file_cache import FileCache

CAP = 8
SMALL_CONSTANT = 4  # a directory being fsynced, a small file being written


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_many_streams_open_fds_never_above_cap(make_storage, config, table_of):
    storage = make_storage(max_open_files=CAP, segment_bytes=1024)
    baseline = open_fds()  # includes the flusher thread and pytest's own files
    peak = baseline
    logs = []
    for index in range(40):
        log = storage.open_log(f"s{index}", config)
        logs.append(log)
        for _ in range(3):  # several segments per stream
            log.append(table_of([b"p" * 400]), ack=AckMode.WRITE)
            peak = max(peak, open_fds())
    for round_ in range(2):
        for index, log in enumerate(logs):
            assert log.read_table(0, 3).column("value").to_pylist() == [b"p" * 400] * 3
            log.append(table_of([f"{round_}-{index}".encode()]))
            peak = max(peak, open_fds())
    assert peak <= baseline + CAP + SMALL_CONSTANT, (baseline, peak)
    for name in [f"s{i}" for i in range(40)]:
        storage.close_log(name)
    assert open_fds() <= baseline


def test_file_cache_evicts_least_recently_used_idle_handle(tmp_path: Path):
    paths = [tmp_path / f"f{i}" for i in range(4)]
    for path in paths:
        path.write_bytes(b"x")
    cache = FileCache(2)
    with cache.borrow(paths[0]):
        pass
    with cache.borrow(paths[1]):
        pass
    with cache.borrow(paths[0]):  # f0 is now the most recently used
        pass
    with cache.borrow(paths[2]):
        pass
    assert cache.open_count() == 2
    assert sorted(p.name for p in cache._handles) == ["f0", "f2"]  # f1 was evicted
    cache.close()


def test_file_cache_never_closes_handle_in_use(tmp_path: Path):
    paths = [tmp_path / f"f{i}" for i in range(3)]
    for index, path in enumerate(paths):
        path.write_bytes(bytes([index]) * 10)
    cache = FileCache(1)
    with cache.borrow(paths[0]) as first, cache.borrow(paths[1]) as second:
        assert cache.open_count() == 2  # over the cap while both are in use
        assert os.pread(first, 1, 0) == b"\x00" and os.pread(second, 1, 0) == b"\x01"
        cache.forget(paths[0])  # deleted while borrowed: closed when returned
        assert os.pread(first, 1, 0) == b"\x00"
    assert cache.open_count() == 1
    with cache.borrow(paths[2]) as third:
        assert os.pread(third, 1, 0) == b"\x02"
    assert cache.open_count() == 1
    cache.close()

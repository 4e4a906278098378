"""Appends: results, ids, size limits, ack modes, disk faults, truncate_to."""

from __future__ import annotations

import errno
import threading
import time

import pyarrow as pa
import pytest

from npstream.broker.errors import (
    DiskFullError,
    DiskIOError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    ShuttingDownError,
)
from npstream.broker.storage import AckMode, StreamConfig


def limited(limit: int) -> StreamConfig:
    return StreamConfig(max_age_ms=0, max_bytes=0, dedup_window_ms=0, max_message_bytes=limit)


def test_append_returns_offsets_and_stores_columns(make_storage, config, table_of, clock):
    log = make_storage().open_log("columns", config)
    result = log.append(table_of([b"v1", b"v2"], ids=["given", None], keys=[b"k", None],
                                 headers=[{"h": b"1"}, None]))
    assert (result.first_offset, result.stored_count, result.duplicates) == (0, 2, [])
    assert result.timestamp_ms == clock.now
    row0, row1 = log.read_table(0, 2).to_pylist()
    assert (row0["offset"], row0["id"], row0["key"], row0["value"], row0["headers"]) == (
        0, "given", b"k", b"v1", [("h", b"1")])
    assert (row1["offset"], row1["key"], row1["headers"]) == (1, None, None)
    assert len(row1["id"]) == 32 and row1["id"].endswith("0000000000000001")
    assert log.append(table_of(1)).first_offset == 2


def test_append_empty_table_stores_nothing(make_storage, config, table_of):
    log = make_storage().open_log("nothing", config)
    result = log.append(table_of([]))
    assert (result.first_offset, result.stored_count, log.end_offset) == (0, 0, 0)


def test_append_over_max_message_bytes_rejects_whole_append(make_storage, table_of):
    log = make_storage().open_log("limits", limited(100))
    log.append(table_of([b"ok"]))
    too_big = table_of([b"a" * 10, b"b" * 60, b"c"], keys=[None, b"k" * 30, None],
                       headers=[None, {"hh": b"x" * 9}, None])  # 60 + 30 + 2 + 9 = 101
    with pytest.raises(MessageTooLargeError) as error:
        log.append(too_big)
    assert (error.value.stream, error.value.index, error.value.size, error.value.limit) == (
        "limits", 1, 101, 100)
    assert "message 1 for stream 'limits' is 101 bytes" in str(error.value)
    assert "nothing was stored" in str(error.value)
    assert log.end_offset == 1
    exactly = table_of([b"b" * 60], keys=[b"k" * 30], headers=[{"hh": b"x" * 8}])  # 100 bytes
    assert log.append(exactly).stored_count == 1
    with pytest.raises(MessageTooLargeError):
        log.append(pa.concat_tables([table_of([b"fine"]), too_big], promote_options="default"))
    assert log.end_offset == 2


def test_append_large_table_splits_into_frames_within_max_batch_bytes(
        make_storage, config, table_of, frames_of, segments_in, data_dir):
    log = make_storage(max_batch_bytes=64 * 1024).open_log("split", config)
    result = log.append(table_of([b"z" * 1000] * 500))
    assert (result.first_offset, result.stored_count) == (0, 500)
    frames = frames_of(segments_in(data_dir / "streams" / "split")[0])
    assert len(frames) > 5
    assert all(header.payload_length <= 80 * 1024 for _, header in frames)
    assert [h.base_offset for _, h in frames] == sorted(h.base_offset for _, h in frames)
    assert sum(h.count for _, h in frames) == 500
    assert log.read_table(0, 500).column("offset").to_pylist() == list(range(500))


def test_append_write_ack_is_fsynced_by_flusher_within_interval(make_storage, config, table_of):
    fsyncs: list[float] = []
    log = make_storage(flush_interval_ms=50, fault_hook=lambda op, path, pos: fsyncs.append(
        time.monotonic()) if op == "fsync" else None).open_log("write-ack", config)
    written = time.monotonic()
    log.append(table_of(3), ack=AckMode.WRITE)
    assert log.read_table(0, 3).num_rows == 3  # visible before the fsync
    deadline = time.monotonic() + 5
    while not fsyncs and time.monotonic() < deadline:
        time.sleep(0.005)
    assert fsyncs and fsyncs[0] - written < 1.0  # generous: the interval is 50 ms
    assert not log.needs_sync()


def test_append_fsync_ack_returns_after_fsync(make_storage, config, table_of):
    events: list[str] = []
    log = make_storage(fault_hook=lambda op, path, pos: events.append(op)).open_log(
        "fsync-ack", config)
    log.append(table_of(2))
    assert events[-2:] == ["write", "fsync"]


def test_append_write_returns_its_sequence_and_sync_through_covers_it(make_storage, config,
                                                                     table_of):
    events: list[str] = []
    log = make_storage(flush_interval_ms=60_000, fault_hook=lambda op, path, pos: events.append(
        op)).open_log("deferred", config)
    first = log.append(table_of(2), AckMode.WRITE)
    second = log.append(table_of(3), AckMode.WRITE)
    first_seq, second_seq = first.write_sequence, second.write_sequence
    assert (first.first_offset, first.stored_count, second.first_offset) == (0, 2, 2)
    assert 0 < first_seq < second_seq
    assert events == ["write", "write"]  # written, visible, not yet fsynced
    assert log.read_table(0, 5).num_rows == 5 and log.needs_sync()
    log.sync_through(first_seq)  # one fsync covers everything written so far
    assert events == ["write", "write", "fsync"] and not log.needs_sync()
    log.sync_through(second_seq)
    assert events.count("fsync") == 1


def test_append_write_fault_fails_group_and_stores_nothing(make_storage, config, table_of,
                                                          segments_in, data_dir):
    failing = threading.Event()

    def hook(operation, path, position):
        if operation == "write" and failing.is_set():
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

    storage = make_storage(fault_hook=hook, max_batch_bytes=2048)
    log = storage.open_log("faulty", config)
    log.append(table_of(3))
    size = segments_in(data_dir / "streams" / "faulty")[0].stat().st_size
    failing.set()
    with pytest.raises(DiskFullError, match=r"append on stream 'faulty' failed, the broker's "
                                            r"data dir has no space left .*nothing of it was "
                                            r"stored") as error:
        log.append(table_of([b"x" * 500] * 10))  # several frames; the first write fails
    assert isinstance(error.value.__cause__ or error.value.__context__, OSError) or \
        "[Errno 28]" in str(error.value)
    assert log.end_offset == 3
    assert segments_in(data_dir / "streams" / "faulty")[0].stat().st_size == size
    failing.clear()
    assert log.append(table_of(1)).first_offset == 3
    storage.close()
    assert make_storage().open_log("faulty", config).end_offset == 4


def test_append_fault_mid_group_rolls_back_written_frames(make_storage, config, table_of,
                                                          segments_in, data_dir):
    writes = []

    def hook(operation, path, position):
        if operation == "write":
            writes.append(position)
            if len(writes) == 4:  # third frame of the second append
                raise OSError(errno.EIO, "I/O error (injected)")

    log = make_storage(fault_hook=hook, max_batch_bytes=2048, segment_bytes=4096).open_log(
        "half", config)
    log.append(table_of(2))
    with pytest.raises(DiskIOError, match="nothing of it was stored"):
        log.append(table_of([b"y" * 700] * 12))
    assert log.end_offset == 2
    assert log.read_table(0, 2).num_rows == 2
    assert log.append(table_of([b"after"])).first_offset == 2
    assert log.read_table(2, 3).column("value").to_pylist() == [b"after"]


def test_append_fsync_fault_makes_log_refuse_writes(make_storage, config, table_of):
    def hook(operation, path, position):
        if operation == "fsync":
            raise OSError(errno.EIO, "fsync failed (injected)")

    log = make_storage(fault_hook=hook).open_log("sick", config)
    with pytest.raises(DiskIOError, match="fsync of its log failed"):
        log.append(table_of(1))
    with pytest.raises(DiskIOError, match="an earlier write or fsync failed"):
        log.append(table_of(1), ack=AckMode.WRITE)
    assert log.read_table(0, 1).num_rows == 1  # reads still work


def test_truncate_to_drops_tail_at_frame_boundaries(make_storage, config, table_of, data_dir):
    storage = make_storage(segment_bytes=1500)
    log = storage.open_log("cut", config)
    for index in range(10):
        log.append(table_of([f"v{index}-{i}".encode() for i in range(4)]))
    assert log.stats().segment_count >= 3
    log.truncate_to(24)  # the batch [24, 28) and the later ones go
    assert log.end_offset == 24
    values = log.read_table(0, 24).column("value").to_pylist()
    assert values == [f"v{o // 4}-{o % 4}".encode() for o in range(24)]
    log.truncate_to(8)  # a batch boundary, segments after it deleted
    assert log.end_offset == 8
    assert log.append(table_of([b"new"])).first_offset == 8
    storage.close()
    reopened = make_storage(segment_bytes=1500).open_log("cut", config)
    assert reopened.end_offset == 9
    assert reopened.read_table(6, 9).column("value").to_pylist() == [b"v1-2", b"v1-3", b"new"]
    with pytest.raises(OffsetOutOfRangeError):
        reopened.truncate_to(10)


def test_append_after_close_raises_shutting_down(make_storage, config, table_of):
    storage = make_storage()
    log = storage.open_log("closed", config)
    storage.close_log("closed")
    with pytest.raises(ShuttingDownError, match="stream 'closed' is closed"):
        log.append(table_of(1))
    assert storage.open_log("closed", config) is not log


def test_drop_log_deletes_files_and_name_can_be_reused(make_storage, config, table_of,
                                                       data_dir):
    storage = make_storage()
    log = storage.open_log("dropme", config)
    log.append(table_of(5))
    storage.drop_log("dropme")
    assert not (data_dir / "streams" / "dropme").exists()
    fresh = storage.open_log("dropme", config)
    assert (fresh.start_offset, fresh.end_offset) == (0, 0)


def test_open_log_invalid_name_raises_invalid_argument(make_storage, config):
    from npstream.broker.errors import InvalidArgumentError

    storage = make_storage()
    for name in ("..", "../etc", "a/b", "", ".hidden"):
        with pytest.raises(InvalidArgumentError, match="invalid stream name"):
            storage.open_log(name, config)

"""Segment rolls (size, age) and offset-range reads over multi-segment logs."""

from __future__ import annotations

import pyarrow as pa
import pytest

from npstream.broker.errors import OffsetOutOfRangeError
from npstream.broker.storage import AckMode
from npstream.proto.frames.payload import decode_payload
from npstream.proto.schema import MESSAGE_SCHEMA


def values_of(result) -> list[bytes]:
    return [v for payload in result.batches for v in decode_payload(payload).column("value")
            .to_pylist()]


def offsets_of(result) -> list[int]:
    return [o for payload in result.batches for o in decode_payload(payload).column("offset")
            .to_pylist()]


@pytest.fixture
def multi_segment_log(make_storage, config, table_of, clock):
    """37 messages in appends of 1..5 rows over several 1 KiB segments; values m<offset>."""
    storage = make_storage(segment_bytes=1024, index_interval_bytes=64)
    log = storage.open_log("multi", config)
    offset = 0
    size = 1
    while offset < 37:
        count = min(size, 37 - offset)
        log.append(table_of([f"m{o}".encode() for o in range(offset, offset + count)]))
        offset += count
        size = size % 5 + 1
        clock.advance(10)
    assert log.stats().segment_count >= 4
    return log


def test_append_over_segment_bytes_rolls_segment(make_storage, config, table_of, data_dir,
                                                 segments_in, frames_of):
    storage = make_storage(segment_bytes=2048)
    log = storage.open_log("rolls", config)
    for _ in range(12):
        log.append(table_of([b"x" * 300]))
    files = segments_in(data_dir / "streams" / "rolls")
    assert len(files) == log.stats().segment_count >= 3
    bases = [int(path.stem) for path in files]
    for path, base, next_base in zip(files, bases, [*bases[1:], log.end_offset], strict=True):
        frames = frames_of(path)
        assert frames[0][1].base_offset == base
        assert frames[-1][1].next_offset == next_base
        if path != files[-1]:  # closed segments stop before they would exceed segment_bytes
            assert path.stat().st_size <= 2048
            assert path.with_suffix(".index").exists()
            assert path.with_suffix(".timeindex").exists()
    assert not files[-1].with_suffix(".index").exists()  # active segment: indexes in memory


def test_append_after_segment_ms_rolls_segment(make_storage, config, table_of, clock,
                                               data_dir, segments_in):
    storage = make_storage(segment_age_ms=60_000)
    log = storage.open_log("aged", config)
    log.append(table_of(2))
    clock.advance(59_999)
    log.append(table_of(2))
    assert log.stats().segment_count == 1
    clock.advance(1)  # 60 s after the segment's first message
    log.append(table_of(2))
    files = segments_in(data_dir / "streams" / "aged")
    assert [int(path.stem) for path in files] == [0, 4]
    clock.advance(59_999)
    log.append(table_of(1))
    assert log.stats().segment_count == 2


def test_read_every_offset_multi_segment_returns_exact_rows(multi_segment_log):
    log = multi_segment_log
    for offset in range(38):
        for max_messages in (1, 3, 100):
            result = log.read(offset, max_messages=max_messages)
            expected = list(range(offset, min(37, offset + max_messages)))
            assert offsets_of(result) == expected, (offset, max_messages)
            assert values_of(result) == [f"m{o}".encode() for o in expected]
            assert result.count == len(expected)
            assert result.next_offset == offset + len(expected)


def test_read_with_end_offset_stops_there(multi_segment_log):
    log = multi_segment_log
    for start in range(0, 37, 4):
        for end in range(start, 38, 3):
            result = log.read(start, end_offset=end)
            assert offsets_of(result) == list(range(start, end))
            assert result.next_offset == end
    beyond = log.read(30, end_offset=1000)
    assert offsets_of(beyond) == list(range(30, 37))


def test_read_table_returns_message_schema_rows(multi_segment_log):
    table = multi_segment_log.read_table(5, 33)
    assert table.schema == MESSAGE_SCHEMA
    assert table.column("offset").to_pylist() == list(range(5, 33))
    assert table.column("value").to_pylist() == [f"m{o}".encode() for o in range(5, 33)]


def test_read_whole_batches_returns_stored_bytes_unchanged(make_storage, config, table_of):
    log = make_storage().open_log("zero-copy", config)
    log.append(table_of(10))
    log.append(table_of(10))
    whole = log.read(0)
    assert [len(payload) for payload in whole.batches] == [
        len(payload) for payload in log.read(0, max_messages=10).batches + log.read(10).batches
    ]
    assert all(isinstance(payload, memoryview) for payload in whole.batches)
    edge = log.read(3, max_messages=4)  # cut batch: re-encoded with exactly those rows
    assert offsets_of(edge) == [3, 4, 5, 6]


def test_read_max_bytes_limits_batches_but_returns_at_least_one_message(
        make_storage, config, table_of):
    log = make_storage().open_log("bytes", config)
    for _ in range(4):
        log.append(table_of([b"v" * 1000] * 10))
    one_batch = len(log.read(0, max_messages=10).batches[0])
    result = log.read(0, max_bytes=one_batch * 2)
    assert result.count == 20 and len(result.batches) == 2
    tiny = log.read(0, max_bytes=1)
    assert tiny.count == 1 and offsets_of(tiny) == [0]
    small = log.read(5, max_bytes=3500)
    assert 1 <= small.count < 5 and offsets_of(small) == list(range(5, 5 + small.count))


def test_read_outside_range_raises_offset_out_of_range(make_storage, config, table_of):
    log = make_storage().open_log("range", config)
    log.append(table_of(3))
    assert log.read(3).count == 0 and log.read(3).next_offset == 3
    with pytest.raises(OffsetOutOfRangeError) as error:
        log.read(4)
    assert (error.value.stream, error.value.offset, error.value.start_offset,
            error.value.end_offset) == (
        "range", 4, 0, 3)
    assert "offset 4 is out of range for stream 'range': start_offset=0, end_offset=3" in str(
        error.value)
    log.delete_before(2)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(1)
    assert offsets_of(log.read(2)) == [2]


def test_reopen_after_close_reads_same_rows_and_continues(make_storage, config, table_of,
                                                          data_dir):
    storage = make_storage(segment_bytes=1024)
    log = storage.open_log("reopen", config)
    for index in range(20):
        log.append(table_of([f"r{index}".encode()] * 3), ack=AckMode.WRITE)
    before = log.read_table(0, log.end_offset)
    storage.close()
    log = make_storage(segment_bytes=1024).open_log("reopen", config)
    assert log.end_offset == 60
    assert log.read_table(0, 60).equals(before)
    log.append(table_of([b"after"]))
    assert log.read_table(60, 61).column("value").to_pylist() == [b"after"]
    assert log.read_table(60, 61).column("offset").to_pylist() == [60]


def test_stats_report_offsets_bytes_and_timestamps(make_storage, config, table_of, clock,
                                                    data_dir, segments_in):
    storage = make_storage(segment_bytes=1024)
    log = storage.open_log("stats", config)
    assert log.stats().segment_count == 0 and log.stats().first_timestamp_ms == 0
    first = clock.now
    for _ in range(10):
        log.append(table_of([b"y" * 200]))
        clock.advance(1000)
    stats = log.stats()
    files = segments_in(data_dir / "streams" / "stats")
    assert (stats.start_offset, stats.end_offset) == (0, 10)
    assert stats.bytes_on_disk == sum(path.stat().st_size for path in files)
    assert stats.segment_count == len(files)
    assert (stats.first_timestamp_ms, stats.last_timestamp_ms) == (first, first + 9000)
    log.delete_before(4)
    assert log.stats().first_timestamp_ms == first + 4000


def test_read_table_of_empty_range_returns_empty_table(make_storage, config):
    log = make_storage().open_log("empty", config)
    table = log.read_table(0, 0)
    assert table.num_rows == 0 and table.schema == MESSAGE_SCHEMA
    assert isinstance(table, pa.Table)

"""offset_for_timestamp: exact on known data, across segments, after delete_before and reopen."""

from __future__ import annotations

import pytest

from npstream.broker.storage.time_index import TimeIndex

STEP_MS = 100


@pytest.fixture
def timed_log(make_storage, config, table_of, clock):
    """60 appends of 1-3 messages, STEP_MS apart, over many segments with sparse indexes.

    Returns (storage, log, timestamps by offset).
    """
    storage = make_storage(segment_bytes=2000, index_interval_bytes=1500)
    log = storage.open_log("timed", config)
    stamps: list[int] = []
    for index in range(60):
        count = index % 3 + 1
        result = log.append(table_of(count))
        assert result.timestamp_ms == clock.now
        stamps += [clock.now] * count
        clock.advance(STEP_MS)
    assert log.stats().segment_count >= 5
    return storage, log, stamps


def expected_offset(stamps: list[int], timestamp: int, start: int = 0) -> int:
    for offset in range(start, len(stamps)):
        if stamps[offset] >= timestamp:
            return offset
    return len(stamps)


def test_offset_for_timestamp_exact_for_every_time(timed_log):
    _storage, log, stamps = timed_log
    for timestamp in range(stamps[0] - 5, stamps[-1] + 10, 7):
        assert log.offset_for_timestamp(timestamp) == expected_offset(stamps, timestamp)
    for timestamp in set(stamps):
        assert log.offset_for_timestamp(timestamp) == stamps.index(timestamp)
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(stamps[-1] + 1) == log.end_offset == len(stamps)


def test_offset_for_timestamp_after_delete_before_never_below_start(timed_log):
    _storage, log, stamps = timed_log
    log.delete_before(50)
    assert log.offset_for_timestamp(0) == 50
    for timestamp in range(stamps[0], stamps[-1] + 5, 11):
        assert log.offset_for_timestamp(timestamp) == max(50, expected_offset(stamps, timestamp))


def test_offset_for_timestamp_after_reopen_uses_sealed_indexes(timed_log, make_storage, config):
    storage, _log, stamps = timed_log
    storage.close()
    log = make_storage(segment_bytes=2000, index_interval_bytes=1500).open_log("timed", config)
    for timestamp in range(stamps[0] - 3, stamps[-1] + 3, 13):
        assert log.offset_for_timestamp(timestamp) == expected_offset(stamps, timestamp)


def test_offset_for_timestamp_clock_going_back_keeps_timestamps_monotonic(make_storage, config,
                                                                          table_of, clock):
    log = make_storage().open_log("backwards", config)
    first = log.append(table_of(2)).timestamp_ms
    clock.advance(-5000)  # wall clock stepped back
    second = log.append(table_of(2)).timestamp_ms
    assert second == first
    assert log.read_table(0, 4).column("timestamp").cast("int64").to_pylist() == [first] * 4
    assert log.offset_for_timestamp(first) == 0 and log.offset_for_timestamp(first + 1) == 4


def test_time_index_file_round_trip_keeps_entries():
    from npstream.broker.storage.sparse_index import IndexFileError, SegmentSeal

    index = TimeIndex()
    for timestamp, relative in [(100, 0), (100, 7), (250, 19)]:
        index.append(timestamp, relative)
    with pytest.raises(ValueError, match=r"entry \(90, 30\) does not follow the last entry"):
        index.append(90, 30)
    seal = SegmentSeal(4096, 123, 42, 250)
    loaded, loaded_seal = TimeIndex.from_bytes(index.to_bytes(seal))
    assert list(loaded.keys) == [100, 100, 250] and list(loaded.values) == [0, 7, 19]
    assert loaded_seal == seal
    assert loaded.relative_offset_before(100) == 0
    assert loaded.relative_offset_before(101) == 7
    assert loaded.relative_offset_before(1000) == 19
    damaged = bytearray(index.to_bytes(seal))
    damaged[50] ^= 1
    with pytest.raises(IndexFileError, match="CRC mismatch"):
        TimeIndex.from_bytes(bytes(damaged))

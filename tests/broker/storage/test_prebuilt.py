"""Framed appends: frames built before their offsets are known, stamped in place when appended."""

from __future__ import annotations

import mmap
import threading

import pyarrow as pa
import pytest

from npstream.broker.errors import MessageTooLargeError
from npstream.broker.storage import AckMode, StreamConfig
from npstream.broker.storage.batch_builder import (
    build_message_batch,
    complete_publish_table,
    serialize_frames,
)
from npstream.broker.storage.framed_append import FramedAppend
from npstream.broker.storage.prebuilt import PrebuiltFrame, stamp_payload
from npstream.proto.frames.record_batch import FLAG_PRODUCER_IDS

ID_PREFIX = b"abcdef0123456789"


def prebuilt(table: pa.Table, max_frame_bytes: int = 1 << 20, *, flags: int = 0,
             largest: int = 0) -> list[PrebuiltFrame]:
    """Frames of ``table`` (publish columns) with placeholder offsets and timestamps.

    Payloads live in a writable anonymous map, as the sink's copy-on-write staging maps.
    """
    batch = build_message_batch(complete_publish_table(table), 0, 0, ID_PREFIX)
    pieces = serialize_frames(batch, max_frame_bytes)
    area = mmap.mmap(-1, sum(p.size for _s, _c, p in pieces))
    frames, position = [], 0
    for _start, count, payload in pieces:
        area[position:position + payload.size] = payload.to_pybytes()
        frames.append(PrebuiltFrame(memoryview(area)[position:position + payload.size], count,
                                    flags, largest))
        position += payload.size
    return frames


def test_prebuilt_frames_get_contiguous_offsets_one_timestamp_and_keep_ids(
        make_storage, config, table_of, clock, frames_of, segments_in, data_dir):
    log = make_storage().open_log("pre", config)
    log.append(table_of([b"before"]))
    clock.advance(5)
    frames = prebuilt(table_of(50, ids=[f"id-{i}" if i % 2 else None for i in range(50)]),
                      max_frame_bytes=1024)
    assert len(frames) > 1
    seen: list[int] = []
    result = log.append(FramedAppend(frames, before_write=lambda first, _ts: seen.append(first)))
    assert seen == [1]
    assert (result.first_offset, result.stored_count, result.duplicates) == (1, 50, [])
    assert result.timestamp_ms == clock.now
    rows = log.read_table(1, 51).to_pylist()
    assert [r["offset"] for r in rows] == list(range(1, 51))
    assert [r["value"] for r in rows] == [f"m{i}".encode() for i in range(50)]
    assert {r["timestamp"].timestamp() * 1000 for r in rows} == {clock.now}
    assert [r["id"] for r in rows][1::2] == [f"id-{i}" for i in range(1, 50, 2)]
    assert all(len(r["id"]) == 32 and r["id"].startswith(ID_PREFIX.decode())
               for r in rows[::2])
    assert log.append(table_of([b"after"])).first_offset == 51
    headers = [h for path in segments_in(data_dir / "streams" / "pre") for _p, h in frames_of(path)]
    assert (headers[0].base_offset, headers[0].count) == (0, 1)
    assert [h.base_offset for h in headers[1:-1]] == list(
        1 + sum(h.count for h in headers[1:i]) for i in range(1, len(headers) - 1))
    assert sum(h.count for h in headers) == 52


def test_prebuilt_frames_survive_reopen_with_valid_crcs(make_storage, config, table_of):
    storage = make_storage()
    log = storage.open_log("crc", config)
    log.append(FramedAppend(prebuilt(table_of(30), max_frame_bytes=512)))
    storage.close_log("crc")
    reopened = storage.open_log("crc", config)
    assert reopened.end_offset == 30
    assert reopened.read_table(0, 30).column("offset").to_pylist() == list(range(30))


def test_prebuilt_frames_over_max_message_bytes_store_nothing(make_storage, table_of):
    limited = StreamConfig(max_age_ms=0, max_bytes=0, dedup_window_ms=0, max_message_bytes=10)
    log = make_storage().open_log("small", limited)
    table = table_of([b"ok", b"x" * 11, b"y"])
    frames = prebuilt(table, largest=11)
    with pytest.raises(MessageTooLargeError) as error:
        log.append(FramedAppend(frames))
    assert (error.value.index, error.value.size, error.value.limit) == (1, 11, 10)
    assert log.end_offset == 0


def test_prebuilt_frames_flagged_with_producer_ids_enter_the_dedup_window(make_storage,
                                                                          table_of):
    dedup = StreamConfig(max_age_ms=0, max_bytes=0, dedup_window_ms=60_000,
                         max_message_bytes=1 << 20)
    log = make_storage().open_log("dedup", dedup)
    log.append(FramedAppend(prebuilt(table_of(2, ids=["a", "b"]), flags=FLAG_PRODUCER_IDS)))
    result = log.append(table_of([b"again"], ids=["b"]))
    assert (result.stored_count, result.duplicates) == (0, [(0, 1)])


def test_stamp_payload_rejects_a_payload_that_is_not_a_stored_batch():
    with pytest.raises(ValueError, match="not a stored-batch payload"):
        stamp_payload(memoryview(bytearray(64)), 0, 0)


def test_a_bad_prebuilt_frame_stores_nothing_of_the_append(make_storage, config, table_of):
    log = make_storage().open_log("bad", config)
    frames = prebuilt(table_of(20), max_frame_bytes=256)
    broken = PrebuiltFrame(memoryview(bytearray(len(frames[-1].payload))), frames[-1].count)
    with pytest.raises(ValueError, match="not a stored-batch payload"):
        log.append(FramedAppend([*frames[:-1], broken]))
    assert log.end_offset == 0
    assert log.append(table_of([b"next"])).first_offset == 0


def test_framed_append_stores_duplicates_but_remembers_ids(make_storage, table_of):
    dedup = StreamConfig(max_age_ms=0, max_bytes=0, dedup_window_ms=60_000,
                         max_message_bytes=1 << 20)
    log = make_storage().open_log("framed-dedup", dedup)
    log.append(table_of([b"a"], ids=["a"]))
    result = log.append(FramedAppend(prebuilt(table_of([b"a again", b"b"], ids=["a", "b"]),
                                              flags=FLAG_PRODUCER_IDS)))
    assert (result.first_offset, result.stored_count, result.duplicates) == (1, 2, [])
    assert log.append(table_of([b"b"], ids=["b"])).duplicates == [(0, 2)]


def test_framed_append_contiguous_with_concurrent_appends_and_before_write_offset(
        make_storage, config, table_of):
    log = make_storage(max_batch_bytes=4096).open_log("atomic", config)
    seen_first: list[tuple[int, int]] = []
    framed_results = []
    stop = threading.Event()

    def chatter(index: int) -> None:
        while not stop.is_set():
            log.append(table_of([f"noise{index}".encode()] * 3), ack=AckMode.WRITE)

    noise = [threading.Thread(target=chatter, args=(i,)) for i in range(4)]
    for thread in noise:
        thread.start()
    try:
        for batch in range(10):
            frames = [frame for part in range(3) for frame in prebuilt(
                table_of([f"a{batch}-{part}-{i}".encode() for i in range(40)]))]

            def before_write(first: int, _timestamp: int, batch: int = batch) -> None:
                seen_first.append((batch, first))
                assert first == log.end_offset  # under the append lock: nothing written yet

            framed_results.append(log.append(FramedAppend(frames, before_write=before_write)))
    finally:
        stop.set()
        for thread in noise:
            thread.join(30)
    for batch, result in enumerate(framed_results):
        assert seen_first[batch] == (batch, result.first_offset)
        assert result.stored_count == 120
        values = log.read_table(result.first_offset, result.first_offset + 120).column(
            "value").to_pylist()
        assert values == [f"a{batch}-{part}-{i}".encode() for part in range(3) for i in range(40)]


def test_framed_append_before_write_raises_nothing_written(make_storage, config, table_of):
    log = make_storage().open_log("refused", config)
    log.append(table_of(2))

    def refuse(first: int, _timestamp: int) -> None:
        raise RuntimeError(f"marker failed at {first}")

    with pytest.raises(RuntimeError, match=r"^marker failed at 2$"):
        log.append(FramedAppend(prebuilt(table_of(5)), before_write=refuse))
    assert log.end_offset == 2
    assert log.append(table_of(1)).first_offset == 2

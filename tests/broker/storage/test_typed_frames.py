"""Typed streams in the storage engine: versioned frames, converted values, every decode path."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from npstream.broker.errors import (
    CorruptRecordError,
    InvalidArgumentError,
    MessageTooLargeError,
    ValueMismatchError,
)
from npstream.broker.storage import UNTYPED, StreamConfig, ValueSchemas
from npstream.broker.storage.group_commit import CommitRequest
from npstream.broker.storage.small_append import MessageRows
from npstream.proto.frames.payload import decode_payload
from npstream.proto.frames.record_batch import encode_frame, parse_header
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.proto.value_schema import parse_schema, stored_schema

V1 = parse_schema("sensorId STRING NOT NULL, reading FLOAT")
V2 = parse_schema("sensorId STRING NOT NULL, reading DOUBLE, unit STRING")
SCHEMAS_1 = ValueSchemas.of({1: V1})
SCHEMAS_2 = SCHEMAS_1.with_version(2, V2)
WINDOW = StreamConfig(max_age_ms=0, max_bytes=0, dedup_window_ms=60_000,
                      max_message_bytes=1 << 20)


def json_table(records: list[str], ids: list[str | None] | None = None) -> pa.Table:
    columns = {"value": pa.array([r.encode() for r in records], pa.binary())}
    if ids is not None:
        columns["id"] = pa.array(ids, pa.string())
    return pa.table(columns)


def readings(n: int, start: int = 0) -> list[str]:
    return [f'{{"sensorId": "s{i}", "reading": {i}.5}}' for i in range(start, start + n)]


def values_of(table: pa.Table) -> list[dict]:
    return table.column("value").to_pylist()


# ---------------------------------------------------------------- frame header


def test_frame_header_carries_schema_version_in_the_crc_covered_word():
    payload = b"\0" * 64
    untyped, header = encode_frame(payload, base_offset=7, count=1, min_timestamp=1,
                                   max_timestamp=1)
    assert header.schema_version == 0
    assert untyped == encode_frame(payload, base_offset=7, count=1, min_timestamp=1,
                                   max_timestamp=1, schema_version=0)[0]
    assert untyped[28:32] == b"\0\0\0\0"  # the old reserved word: untyped frames unchanged
    typed, typed_header = encode_frame(payload, base_offset=7, count=1, min_timestamp=1,
                                       max_timestamp=1, schema_version=3)
    assert typed[28:32] == (3).to_bytes(4, "little")
    assert typed_header.crc != header.crc  # covered by the CRC
    assert parse_header(typed).schema_version == 3


# ---------------------------------------------------------------- appends and reads


def test_typed_append_stores_struct_values_in_versioned_frames(make_storage, config, frames_of,
                                                               segments_in):
    log = make_storage().open_log("typed", config, SCHEMAS_1)
    result = log.append(json_table(readings(3)))
    assert (result.first_offset, result.stored_count) == (0, 3)
    table = log.read_table(0, 3)
    assert table.schema == stored_schema(V1)
    assert values_of(table) == [{"sensorId": f"s{i}", "reading": i + 0.5} for i in range(3)]
    frames = frames_of(segments_in(log.directory)[0])
    assert [header.schema_version for _, header in frames] == [1]


def test_typed_append_accepts_a_struct_value_column(make_storage, config):
    log = make_storage().open_log("struct", config, SCHEMAS_1)
    value = pa.array([{"reading": 1.0, "sensorId": "a"}],
                     pa.struct([("reading", pa.float64()), ("sensorId", pa.string())]))
    log.append(pa.table({"value": value}))
    assert values_of(log.read_table(0, 1)) == [{"sensorId": "a", "reading": 1.0}]


def test_message_rows_take_the_table_path_on_a_typed_stream(make_storage, config):
    log = make_storage().open_log("rows", config, SCHEMAS_1)
    log.append(MessageRows([b'{"sensorId": "x"}'], [""], [None], [None]))
    log.append(MessageRows([b'{"sensorId": "y", "reading": 2}', b'{"sensorId": "z"}'],
                           ["id-y", ""], [b"k", None], [{"h": b"v"}, None]))
    table = log.read_table(0, 3)
    assert values_of(table) == [{"sensorId": "x", "reading": None},
                                {"sensorId": "y", "reading": 2.0},
                                {"sensorId": "z", "reading": None}]
    assert table.column("id").to_pylist()[1] == "id-y"
    assert table.column("key").to_pylist() == [None, b"k", None]


def test_value_mismatch_stores_nothing(make_storage, config):
    log = make_storage().open_log("mismatch", config, SCHEMAS_1)
    log.append(json_table(readings(2)))
    with pytest.raises(ValueMismatchError) as caught:
        log.append(json_table([*readings(2), '{"sensorId": "s", "reading": "warm"}']))
    assert "message 2" in str(caught.value) and "'reading'" in str(caught.value)
    assert "FLOAT" in str(caught.value)
    with pytest.raises(ValueMismatchError, match="message 0: field 'sensorId'"):
        log.append(MessageRows([b'{"reading": 1}'], [""], [None], [None]))
    assert log.end_offset == 2


def test_struct_value_into_an_untyped_stream_is_refused(make_storage, config):
    log = make_storage().open_log("untyped", config)
    value = pa.array([{"a": 1}])
    with pytest.raises(InvalidArgumentError, match="no value schema"):
        log.append(pa.table({"value": value}))
    assert log.end_offset == 0


def test_max_message_bytes_counts_the_record(make_storage):
    limit = StreamConfig(max_age_ms=0, max_bytes=0, dedup_window_ms=0, max_message_bytes=20)
    log = make_storage().open_log("sizes", limit, SCHEMAS_1)
    log.append(json_table(['{"sensorId": "0123456789abcdef", "reading": 1}']))  # 16 + 4 bytes
    with pytest.raises(MessageTooLargeError) as caught:
        log.append(json_table(['{"sensorId": "a"}', '{"sensorId": "0123456789abcdefg", '
                               '"reading": 1}']))
    assert "message 1" in str(caught.value) or "index 1" in str(caught.value)
    assert log.end_offset == 1


def test_evolution_reads_old_batches_in_the_latest_version(make_storage, config, frames_of,
                                                           segments_in):
    storage = make_storage()
    log = storage.open_log("evolve", config, SCHEMAS_1)
    log.append(json_table(readings(2)))
    log.set_value_schemas(SCHEMAS_2)
    log.append(json_table(['{"sensorId": "n", "reading": 1e300, "unit": "C"}']))
    assert [h.schema_version for _, h in frames_of(segments_in(log.directory)[0])] == [1, 2]
    raw = log.read(0)
    assert raw.versions == (1, 2) and raw.schema_version == 0
    latest = log.read(0, latest=True)
    assert latest.versions == (2, 2) and latest.schema_version == 2
    assert latest.batches[1] is raw.batches[1] or bytes(latest.batches[1]) == bytes(
        raw.batches[1])  # the current version's frame goes out as stored
    table = log.read_table(0, 3)
    assert table.schema == stored_schema(V2)
    assert values_of(table) == [
        {"sensorId": "s0", "reading": 0.5, "unit": None},
        {"sensorId": "s1", "reading": 1.5, "unit": None},
        {"sensorId": "n", "reading": 1e300, "unit": "C"},
    ]
    # an edge cut re-encodes a frame in its own version
    cut = log.read(1, max_messages=1, latest=True)
    assert decode_payload(cut.batches[0], stored_schema(V2)).column("value").to_pylist() == [
        {"sensorId": "s1", "reading": 1.5, "unit": None}]


def test_recent_rows_are_in_the_latest_version(make_storage, config):
    log = make_storage().open_log("recent", config, SCHEMAS_1)
    log.append(json_table(readings(2)))
    assert log.recent_rows(0).schema == stored_schema(V1)
    log.set_value_schemas(SCHEMAS_2)
    recent = log.recent_rows(1)
    assert recent.schema == stored_schema(V2)
    assert recent.column("value").to_pylist() == [{"sensorId": "s1", "reading": 1.5,
                                                   "unit": None}]


def test_reopen_decodes_with_the_given_schemas(make_storage, config, data_dir):
    storage = make_storage()
    log = storage.open_log("reopen", config, SCHEMAS_1)
    log.append(json_table(readings(2)))
    log.set_value_schemas(SCHEMAS_2)
    log.append(json_table(readings(1, start=5)))
    storage.close()
    log = make_storage().open_log("reopen", config, SCHEMAS_2)
    assert [v["sensorId"] for v in values_of(log.read_table(0, 3))] == ["s0", "s1", "s5"]
    assert log.offset_for_timestamp(0) == 0


def test_unknown_version_is_corruption_not_a_guess(make_storage, config):
    storage = make_storage()
    log = storage.open_log("unknown", config, SCHEMAS_2)
    log.append(json_table(readings(1)))
    storage.close()
    log = make_storage().open_log("unknown", config, SCHEMAS_1)
    with pytest.raises(CorruptRecordError, match="value schema version 2"):
        log.read(0, latest=True)


def test_dedup_window_rebuilds_from_typed_frames(make_storage, clock):
    storage = make_storage()
    log = storage.open_log("dedup", WINDOW, SCHEMAS_1)
    log.append(json_table(readings(2), ids=["a", "b"]))
    storage.close()
    clock.advance(1000)
    log = make_storage().open_log("dedup", WINDOW, SCHEMAS_1)
    result = log.append(json_table(readings(2, start=7), ids=["b", "c"]))
    assert (result.first_offset, result.stored_count, result.duplicates) == (2, 1, [(0, 1)])


def test_truncate_keeps_the_typed_frames_before_the_cut(make_storage, config, frames_of,
                                                        segments_in):
    log = make_storage().open_log("truncate", config, SCHEMAS_1)
    log.append(json_table(readings(2)))
    log.append(json_table(readings(2, start=2)))
    log.truncate_to(2)
    assert [h.schema_version for _, h in frames_of(segments_in(log.directory)[0])] == [1]
    assert [v["sensorId"] for v in values_of(log.read_table(0, 2))] == ["s0", "s1"]


def test_retention_and_deletion_work_on_typed_streams(make_storage, config):
    log = make_storage(segment_bytes=1024).open_log("delete", config, SCHEMAS_1)
    for start in range(0, 40, 4):
        log.append(json_table(readings(4, start=start)))
    log.delete_before(10)
    assert log.start_offset == 10
    assert values_of(log.read_table(10, 11))[0]["sensorId"] == "s10"
    log.delete_all()
    assert log.start_offset == log.end_offset == 40


def test_idle_retention_opens_typed_streams_with_their_schemas(make_storage, clock):
    aged = StreamConfig(max_age_ms=1000, max_bytes=0, dedup_window_ms=60_000,
                        max_message_bytes=0)
    storage = make_storage(segment_bytes=1024)
    log = storage.open_log("idle", aged, SCHEMAS_1)
    for start in range(0, 40, 4):
        log.append(json_table(readings(4, start=start), ids=[f"i{start + i}" for i in range(4)]))
    storage.close()
    storage = make_storage(segment_bytes=1024)
    storage.set_value_schema_lookup(lambda name: SCHEMAS_1 if name == "idle" else UNTYPED)
    clock.advance(5000)
    storage.enforce_retention()  # opens the idle stream (dedup rebuilt: typed frames decoded)
    log = storage.open_log("idle", aged, SCHEMAS_1)
    assert log.start_offset == log.end_offset == 40


def test_untyped_append_queued_before_the_stream_became_typed_fails_alone(make_storage,
                                                                          config, table_of):
    log = make_storage().open_log("switch", config)
    entered, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold(_start: int, _end: int) -> None:
        entered.set()
        release.wait(5)

    # The switch holds the append lock; an untyped append checked before it queues behind.
    switch = threading.Thread(target=log.set_value_schemas, args=(SCHEMAS_1, hold))
    switch.start()
    entered.wait(5)
    pending = log._appender.prepare(table_of([b"raw"]))  # checked while the stream was untyped

    def late_append() -> None:
        try:
            log._appender._submit(log_request(pending))
        except BaseException as exc:  # the test inspects it
            failures.append(exc)

    appender = threading.Thread(target=late_append)
    appender.start()
    release.set()
    switch.join(5)
    appender.join(5)
    assert len(failures) == 1 and isinstance(failures[0], ValueMismatchError)
    assert "became typed" in str(failures[0])
    assert log.end_offset == 0
    log.append(json_table(readings(1)))
    assert log.end_offset == 1


def log_request(pending: object) -> CommitRequest:
    return CommitRequest(pending, 1, fsync=True)


def test_a_group_mixing_versions_writes_each_in_its_own(make_storage, config, frames_of,
                                                        segments_in):
    log = make_storage().open_log("mixed", config, SCHEMAS_1)
    older = log._appender.prepare(json_table(readings(2)))  # checked before the evolution
    log.set_value_schemas(SCHEMAS_2)
    newer = log._appender.prepare(json_table(['{"sensorId": "n", "unit": "K"}']))
    requests = [CommitRequest(older, 1, fsync=False), CommitRequest(newer, 1, fsync=False)]
    with log._store.lock:
        log._appender._write_group_locked(requests)
    assert [(r.result.first_offset, r.result.stored_count) for r in requests] == [(0, 2), (2, 1)]
    assert [h.schema_version for _, h in frames_of(segments_in(log.directory)[0])] == [1, 2]
    assert log.recent_rows(0) is None  # no single batch holds the group
    assert values_of(log.read_table(0, 3)) == [
        {"sensorId": "s0", "reading": 0.5, "unit": None},
        {"sensorId": "s1", "reading": 1.5, "unit": None},
        {"sensorId": "n", "reading": None, "unit": "K"}]


def test_untyped_streams_still_decode_with_message_schema(make_storage, config, table_of):
    log = make_storage().open_log("plain", config)
    log.append(table_of([b"a", b"b"]))
    result = log.read(0, latest=True)
    assert result.versions == () and result.schema_version == 0
    assert decode_payload(result.batches[0]).schema == MESSAGE_SCHEMA


def test_append_of_typed_tables_converts_each(make_storage, config):
    log = make_storage().open_log("atomic", config, SCHEMAS_1)
    result = log.append(pa.concat_tables([json_table(readings(2)),
                                          json_table(readings(1, start=9))]))
    assert (result.first_offset, result.stored_count) == (0, 3)
    assert [v["sensorId"] for v in values_of(log.read_table(0, 3))] == ["s0", "s1", "s9"]
    with pytest.raises(ValueMismatchError):
        log.append(json_table(['{"reading": 1}']))
    assert log.end_offset == 3

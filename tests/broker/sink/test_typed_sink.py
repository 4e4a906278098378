"""Exactly-once sink writes into typed streams, against a real broker process.

Stage converts a typed target's values (struct column or JSON objects) to its
current schema version and frames them in that version; the commit checks
that the stream still has the schema, then appends them like untyped frames.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from npstream import Client
from npstream.errors import (
    IncompatibleSchema,
    InvalidArgument,
    MessageTooLarge,
    StagingNotFound,
    StreamNotFound,
    ValueMismatch,
)
from npstream.sink.client import SinkClient

DDL = "sensorId STRING NOT NULL, reading DOUBLE, ts TIMESTAMP"
V2 = "sensorId STRING NOT NULL, reading DOUBLE, ts TIMESTAMP, unit STRING"
TS = datetime(2026, 11, 24, 5, 0, tzinfo=UTC)
VALUE_TYPE = pa.struct([("sensorId", pa.string()), ("reading", pa.float64()),
                        ("ts", pa.timestamp("us", tz="UTC"))])


def readings(n: int, start: int = 0) -> pa.Table:
    """n typed rows as a Spark task would send them: a struct value column, ids."""
    values = pa.StructArray.from_arrays(
        [pa.array([f"s{i % 3}" for i in range(start, start + n)]),
         pa.array([float(i) for i in range(start, start + n)]),
         pa.array([TS] * n, pa.timestamp("us", tz="UTC"))],
        fields=list(VALUE_TYPE))
    return pa.table({"id": [f"r{i}" for i in range(start, start + n)], "value": values})


def records(client: Client, stream: str) -> list[dict]:
    end = client.stream_info(stream).end_offset
    table = pa.Table.from_batches(list(client.read_range(stream, 0, end)))
    return table.column("value").to_pylist()


@pytest.fixture
def sink(client: Client) -> SinkClient:
    return client.sink(local_staging=False)


def test_struct_rows_commit_into_a_typed_stream_with_ids_and_offsets(client, sink,
                                                                     stream_name):
    client.create_stream(stream_name, schema=DDL)
    client.publish(stream_name, {"sensorId": "before", "reading": 0.5})
    sink.stage("typed-a", 0, "0-0", stream_name, readings(3))
    sink.stage("typed-a", 0, "0-1", stream_name, readings(2, start=3))

    result = sink.commit("typed-a", 0, ["0-0", "0-1"])

    assert result.written == {stream_name: (1, 6)}
    table = pa.Table.from_batches(list(client.read_range(stream_name, 1, 6)))
    assert table.column("offset").to_pylist() == [1, 2, 3, 4, 5]
    assert table.column("id").to_pylist() == ["r0", "r1", "r2", "r3", "r4"]
    assert records(client, stream_name)[1:] == [
        {"sensorId": f"s{i % 3}", "reading": float(i), "ts": TS} for i in range(5)]
    assert sink.commit("typed-a", 0, ["0-0", "0-1"]).already_committed


def test_json_values_are_converted_like_a_publish(client, sink, stream_name):
    client.create_stream(stream_name, schema=DDL)
    rows = [{"sensorId": "a", "reading": 1}, {"sensorId": "b", "ts": "2026-11-24T05:00:00Z"}]
    sink.stage("typed-json", 0, "0-0", stream_name,
               pa.table({"value": [json.dumps(r).encode() for r in rows]}))
    sink.commit("typed-json", 0, ["0-0"])
    assert records(client, stream_name) == [
        {"sensorId": "a", "reading": 1.0, "ts": None},
        {"sensorId": "b", "reading": None, "ts": TS}]


def test_a_value_that_does_not_fit_names_row_field_and_type_and_stages_nothing(
        client, sink, stream_name):
    client.create_stream(stream_name, schema=DDL)
    bad = readings(4)
    values = pa.StructArray.from_arrays(
        [pa.array(["a", "b", None, "d"]), *bad.column("value").combine_chunks().flatten()[1:]],
        fields=list(VALUE_TYPE))
    with pytest.raises(ValueMismatch) as info:
        sink.stage("typed-bad", 0, "0-0", stream_name, bad.set_column(1, "value", values))
    assert (f"row 2 for stream '{stream_name}' (value schema version 1): field 'sensorId' is "
            "null (NOT NULL); expected STRING; nothing was staged") in str(info.value)
    with pytest.raises(StagingNotFound):
        sink.commit("typed-bad", 0, ["0-0"])
    assert client.stream_info(stream_name).end_offset == 0


def test_extra_column_in_the_struct_is_refused_naming_it(client, sink, stream_name):
    client.create_stream(stream_name, schema=DDL)
    table = readings(1)
    value = table.column("value").combine_chunks()
    extra = pa.StructArray.from_arrays([*value.flatten(), pa.array(["x"])],
                                       names=[*VALUE_TYPE.names, "color"])
    with pytest.raises(ValueMismatch, match=r"row 0 .*field 'color' is not in the schema"):
        sink.stage("typed-extra", 0, "0-0", stream_name, table.set_column(1, "value", extra))


def test_struct_for_an_untyped_or_missing_stream_is_refused(client, sink, stream_name):
    client.create_stream(stream_name)
    with pytest.raises(InvalidArgument, match=r"the stream is untyped \(binary values\)"):
        sink.stage("typed-untyped", 0, "0-0", stream_name, readings(1))
    with pytest.raises(InvalidArgument, match=r"does not exist and would be created untyped"):
        sink.stage("typed-untyped", 0, "0-1", f"{stream_name}-new", readings(1))


def test_routed_rows_go_typed_to_the_typed_stream_and_as_bytes_to_the_other(
        client, sink, stream_name):
    typed, plain = f"{stream_name}-t", f"{stream_name}-p"
    client.create_stream(typed, schema=DDL)
    client.create_stream(plain)
    messages = [b'{"sensorId": "a"}', b'{"sensorId": "b"}', b'{"sensorId": "c"}']
    sink.stage("typed-routed", 0, "0-0", None,
               pa.table({"value": messages, "stream": [typed, plain, typed]}))
    assert sink.commit("typed-routed", 0, ["0-0"]).written == {typed: (0, 2), plain: (0, 1)}
    assert records(client, typed) == [{"sensorId": "a", "reading": None, "ts": None},
                                      {"sensorId": "c", "reading": None, "ts": None}]
    assert records(client, plain) == [b'{"sensorId": "b"}']


def test_rows_staged_before_an_evolution_commit_in_their_version(client, sink, stream_name):
    client.create_stream(stream_name, schema=DDL)
    sink.stage("typed-evolve", 0, "0-0", stream_name, readings(2))
    client.update_stream(stream_name, schema=V2)
    client.publish(stream_name, {"sensorId": "after", "unit": "C"})
    assert sink.commit("typed-evolve", 0, ["0-0"]).written == {stream_name: (1, 3)}
    assert records(client, stream_name) == [
        {"sensorId": "after", "reading": None, "ts": None, "unit": "C"},
        {"sensorId": "s0", "reading": 0.0, "ts": TS, "unit": None},
        {"sensorId": "s1", "reading": 1.0, "ts": TS, "unit": None}]


def stage_to_both(sink: SinkClient, sink_id: str, stream: str, other: str) -> None:
    """Stage JSON rows for ``stream`` and one for the untyped ``other`` in one staging, so
    that deleting ``stream`` leaves the staging in place (a staging that targets only a
    deleted stream is dropped with it)."""
    sink.stage(sink_id, 0, "0-0", None, pa.table({
        "value": [b'{"sensorId": "a", "reading": 1}', b'{"sensorId": "b"}', b"raw"],
        "stream": [stream, stream, other]}))


def test_commit_into_a_stream_recreated_with_another_schema_is_refused(
        client, sink, stream_name):
    other = f"{stream_name}-o"
    client.create_stream(stream_name, schema=DDL)
    client.create_stream(other)
    stage_to_both(sink, "typed-recreated", stream_name, other)
    client.delete_stream(stream_name)
    client.create_stream(stream_name, schema="sensorId STRING NOT NULL, reading INT")
    with pytest.raises(IncompatibleSchema) as info:
        sink.commit("typed-recreated", 0, ["0-0"])
    assert (f"staging '0-0' holds rows for stream '{stream_name}' in value schema version 1 "
            "(sensorId STRING NOT NULL, reading DOUBLE, ts TIMESTAMP), but the stream is now "
            "typed (current version 1: sensorId STRING NOT NULL, reading INT); nothing was "
            "appended") in str(info.value)
    assert client.stream_info(stream_name).end_offset == 0
    assert client.stream_info(other).end_offset == 0
    assert sink.abort("typed-recreated", 0) == 1


def test_untyped_staging_does_not_land_in_a_stream_that_became_typed(client, sink,
                                                                      stream_name):
    other = f"{stream_name}-o"
    client.create_stream(stream_name)
    client.create_stream(other)
    stage_to_both(sink, "typed-became", stream_name, other)
    client.delete_stream(stream_name)
    client.create_stream(stream_name, schema=DDL)
    with pytest.raises(IncompatibleSchema, match=r"holds rows for stream '.*' untyped \(binary "
                                                 r"values\), but the stream is now typed"):
        sink.commit("typed-became", 0, ["0-0"])
    assert client.stream_info(stream_name).end_offset == 0


def test_typed_staging_of_a_deleted_stream_does_not_recreate_it_untyped(
        client, sink, stream_name):
    other = f"{stream_name}-o"
    client.create_stream(stream_name, schema=DDL)
    client.create_stream(other)
    stage_to_both(sink, "typed-deleted", stream_name, other)
    client.delete_stream(stream_name)
    with pytest.raises(StreamNotFound):
        sink.commit("typed-deleted", 0, ["0-0"])
    assert stream_name not in [s.name for s in client.list_streams()]
    assert client.stream_info(other).end_offset == 0


def test_a_limit_lowered_after_staging_is_checked_at_commit(client, sink, stream_name):
    client.create_stream(stream_name, schema=DDL)
    table = readings(3)
    sink.stage("typed-limit", 0, "0-0", stream_name, table)
    client.update_stream(stream_name, max_message_bytes=10)  # a value: 2 + 8 + 8 bytes
    with pytest.raises(MessageTooLarge, match=r"message 0 for stream '.*' is 18 bytes, over "
                                              r"the stream's max_message_bytes=10; nothing "
                                              r"was stored"):
        sink.commit("typed-limit", 0, ["0-0"])
    assert client.stream_info(stream_name).end_offset == 0


def test_large_typed_staging_is_adopted_and_survives_kill_9(broker_factory):
    """A typed staging over sink_adopt_min_bytes becomes a segment in place; its frames carry
    the version, producer ids enter the dedup window, and all of it survives kill -9."""
    broker = broker_factory("typed-adopt")
    rows = 120_000  # ~5 MiB of Arrow: over the default 4 MiB adopt threshold
    with Client(broker.address) as client:
        client.create_stream("big", schema=DDL, dedup_window="10m")
        sink = client.sink(local_staging=False)
        sink.stage("typed-big", 0, "0-0", "big", readings(rows))
        assert sink.commit("typed-big", 0, ["0-0"]).written == {"big": (0, rows)}
        assert "1 adopted as segments" in broker.log_text()
    broker.restart(hard=True)
    with Client(broker.address) as client:
        table = pa.Table.from_batches(list(client.read_range("big", rows - 2, rows)))
        assert table.column("value").to_pylist() == [
            {"sensorId": f"s{i % 3}", "reading": float(i), "ts": TS}
            for i in range(rows - 2, rows)]
        again = client.publish_batch("big", readings(1, start=rows - 1))
        assert again.stored_count == 0  # r{rows-1} is remembered by the dedup window
        assert client.stream_info("big").end_offset == rows


def test_typed_stage_through_the_local_inbox(client, stream_name):
    client.create_stream(stream_name, schema=DDL)
    sink = client.sink()  # on the broker's machine: the data goes by file
    sink.stage("typed-inbox", 0, "0-0", stream_name, readings(2))
    sink.commit("typed-inbox", 0, ["0-0"])
    assert [r["sensorId"] for r in records(client, stream_name)] == ["s0", "s1"]

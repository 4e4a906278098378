"""Typed streams through the client SDK: schemas in every form, publishing, every read path."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from npstream import (
    Client,
    IncompatibleSchema,
    InvalidArgumentType,
    InvalidSchema,
    MessageTooLarge,
    ValueMismatch,
)
from npstream.client.models import SchemaVersion, StreamInfo
from npstream.proto import pb
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.proto.value_schema import parse_schema, serialize_schema, stored_schema

DDL = "sensorId STRING NOT NULL, reading FLOAT"
V2 = "sensorId STRING NOT NULL, reading DOUBLE, unit STRING"
VALUE_TYPE = pa.struct([pa.field("sensorId", pa.string(), nullable=False),
                        ("reading", pa.float32())])


def values(table: pa.Table | list[pa.RecordBatch]) -> list[dict]:
    if isinstance(table, list):
        table = pa.Table.from_batches(table)
    return table.column("value").to_pylist()


@pytest.fixture
def remote(broker):
    with Client(broker.address, local_reads=False) as c:
        yield c


# ---------------------------------------------------------------- schemas


def test_create_stream_schema_as_ddl_json_or_pyarrow(client, stream_name):
    info = client.create_stream(stream_name, schema=DDL)
    assert info.value_schema.equals(parse_schema(DDL))
    assert [(v.version, v.ddl) for v in info.schema_versions] == [(1, DDL)]
    assert info.schema_versions[0].created is not None
    spark_json = json.dumps({"type": "struct", "fields": [
        {"name": "sensorId", "type": "string", "nullable": False, "metadata": {}},
        {"name": "reading", "type": "float", "nullable": True, "metadata": {}}]})
    assert client.create_stream(stream_name, schema=spark_json).schema_versions == (
        info.schema_versions)  # the same schema: no error, no new version
    arrow = pa.schema([pa.field("sensorId", pa.string(), nullable=False),
                       ("reading", pa.float32())])
    assert client.create_stream(stream_name, schema=arrow).schema_versions == (
        info.schema_versions)
    assert client.stream_info(stream_name).value_schema.equals(arrow)


def test_untyped_stream_info_has_no_schema(client, stream_name):
    info = client.create_stream(stream_name)
    assert (info.value_schema, info.schema_versions) == (None, [])
    assert "value_schema" not in repr(info)
    assert info.to_dict()["value_schema"] is None and info.to_dict()["schema_versions"] == []


def test_stream_info_repr_and_dict_show_the_schema():
    message = pb.StreamInfo(name="r", value_schemas=[
        pb.ValueSchema(version=1, ddl="a INT", created_ms=1735689600000,
                       arrow_schema=serialize_schema(parse_schema("a INT"))),
        pb.ValueSchema(version=2, ddl="a BIGINT", created_ms=1735689601000,
                       arrow_schema=serialize_schema(parse_schema("a BIGINT")))])
    info = StreamInfo.from_pb(message)
    assert info.value_schema.equals(parse_schema("a BIGINT"))
    assert info.schema_versions[0] == SchemaVersion(1, "a INT", parse_schema("a INT"),
                                                     1735689600000)
    text = repr(info)
    assert "value_schema='a BIGINT'" in text
    assert "SchemaVersion(version=1, ddl='a INT', created_ms=1735689600000 " in text
    data = info.to_dict()
    assert data["value_schema"] == "a BIGINT"
    assert data["schema_versions"][1] == {"version": 2, "ddl": "a BIGINT",
                                          "created_ms": 1735689601000,
                                          "created": "2025-01-01T00:00:01.000Z"}
    json.dumps(data)  # JSON-ready


def test_invalid_schemas_are_refused_with_their_reason(client, stream_name):
    with pytest.raises(InvalidSchema, match="INTEGR"):
        client.create_stream(stream_name, schema="a INTEGR")  # the broker's parser
    with pytest.raises(InvalidSchema, match=r"uint32.*'a'"):
        client.create_stream(stream_name, schema=pa.schema([("a", pa.uint32())]))  # client-side
    with pytest.raises(InvalidSchema, match="empty"):
        client.create_stream(stream_name, schema=" ")
    with pytest.raises(InvalidArgumentType):
        client.create_stream(stream_name, schema=42)  # type: ignore[arg-type]
    assert stream_name not in [s.name for s in client.list_streams(prefix=stream_name)]


def test_update_stream_evolves_or_refuses(client, stream_name):
    client.create_stream(stream_name, schema=DDL)
    info = client.update_stream(stream_name, schema=V2)
    assert [v.version for v in info.schema_versions] == [1, 2]
    assert info.value_schema.equals(parse_schema(V2))
    with pytest.raises(IncompatibleSchema, match="field 'reading' changed from DOUBLE to FLOAT"):
        client.update_stream(stream_name, schema=DDL)
    assert isinstance(IncompatibleSchema("x"), InvalidSchema)
    assert [v.version for v in client.stream_info(stream_name).schema_versions] == [1, 2]


def test_untyped_to_typed_needs_an_empty_stream(client, stream_name):
    client.create_stream(stream_name)
    client.publish(stream_name, b"raw")
    with pytest.raises(IncompatibleSchema, match="holds no messages"):
        client.update_stream(stream_name, schema=DDL)
    client.delete_messages(stream_name)
    assert client.update_stream(stream_name, schema=DDL).schema_versions[0].version == 1


# ---------------------------------------------------------------- publishing


def test_publish_dict_and_fetch_struct_rows(client, stream_name):
    client.create_stream(stream_name, schema=DDL)
    first = client.publish(stream_name, {"sensorId": "s1", "reading": 21.5}, id="r1",
                           key="k", headers={"h": "v"})
    client.publish(stream_name, {"sensorId": "s2"})
    assert first.offset == 0
    table = client.fetch(stream_name, 0)
    assert table.schema == stored_schema(parse_schema(DDL))
    assert values(table) == [{"sensorId": "s1", "reading": 21.5},
                             {"sensorId": "s2", "reading": None}]
    assert table.column("id").to_pylist()[0] == "r1"
    assert table.column("key").to_pylist()[0] == b"k"


def test_publish_batch_dicts_struct_tables_and_iterators(client, stream_name):
    client.create_stream(stream_name, schema=DDL)
    result = client.publish_batch(stream_name, [
        {"id": "a", "value": {"sensorId": "a", "reading": 1.5}},
        {"value": {"sensorId": "b"}},
    ])
    assert result.offsets == [0, 1]
    struct = pa.table({"value": pa.array([{"sensorId": f"t{i}", "reading": float(i)}
                                          for i in range(3)], VALUE_TYPE)})
    assert client.publish_batch(stream_name, struct).offsets == [2, 3, 4]
    parts = (pa.table({"value": pa.array([{"sensorId": f"it{i}"}], VALUE_TYPE)})
             for i in range(2))
    assert client.publish_batch(stream_name, parts).stored_count == 2
    assert [v["sensorId"] for v in values(client.fetch(stream_name, 0))] == [
        "a", "b", "t0", "t1", "t2", "it0", "it1"]


def test_large_struct_tables_split_into_requests(client, stream_name):
    client.create_stream(stream_name, schema="sensorId STRING NOT NULL, blob STRING")
    rows = 2000
    table = pa.table({"value": pa.array(
        [{"sensorId": f"s{i}", "blob": "x" * 5000} for i in range(rows)],
        pa.struct([pa.field("sensorId", pa.string(), nullable=False), ("blob", pa.string())]))})
    result = client.publish_batch(stream_name, table)  # ~10 MB: several pipelined requests
    assert result.offsets == list(range(rows))
    read = pa.Table.from_batches(list(client.read_range(stream_name, 0, rows)))
    assert read.num_rows == rows and values(read.slice(rows - 1))[0]["sensorId"] == f"s{rows - 1}"


def test_value_mismatch_names_the_message_and_stores_nothing(client, stream_name):
    client.create_stream(stream_name, schema=DDL)
    client.publish(stream_name, {"sensorId": "ok"})
    with pytest.raises(ValueMismatch) as caught:
        client.publish_batch(stream_name, [{"value": {"sensorId": "a"}},
                                           {"value": {"sensorId": "b", "reading": "warm"}}])
    assert "message 1" in str(caught.value) and "'reading'" in str(caught.value)
    assert "FLOAT" in str(caught.value)
    with pytest.raises(ValueMismatch, match="'sensorId'"):
        client.publish(stream_name, {"reading": 1.0})
    with pytest.raises(ValueMismatch, match="'extra'"):
        client.publish_batch(stream_name, pa.table({"value": pa.array(
            [{"sensorId": "x", "extra": 1}])}))
    assert client.stream_info(stream_name).end_offset == 1


def test_max_message_bytes_counts_typed_records(client, stream_name):
    client.create_stream(stream_name, schema=DDL, max_message_bytes=12)
    client.publish(stream_name, {"sensorId": "12345678", "reading": 1})  # 8 + 4 bytes
    with pytest.raises(MessageTooLarge):
        client.publish(stream_name, {"sensorId": "123456789", "reading": 1})
    assert client.stream_info(stream_name).end_offset == 1


# ---------------------------------------------------------------- reading


def _two_versions(client: Client, stream: str) -> list[dict]:
    client.create_stream(stream, schema=DDL)
    client.publish_batch(stream, [{"value": {"sensorId": f"old{i}", "reading": i + 0.5}}
                                  for i in range(3)])
    client.update_stream(stream, schema=V2)
    client.publish_batch(stream, [{"value": {"sensorId": "new", "reading": 1e300,
                                             "unit": "C"}}])
    return [*({"sensorId": f"old{i}", "reading": i + 0.5, "unit": None} for i in range(3)),
            {"sensorId": "new", "reading": 1e300, "unit": "C"}]


def test_every_read_path_gives_the_latest_version(client, remote, stream_name):
    expected = _two_versions(client, stream_name)
    latest = stored_schema(parse_schema(V2))
    for reader in (client, remote):  # local reads (same host) and gRPC
        assert reader.fetch(stream_name, 0).schema == latest
        assert values(reader.fetch(stream_name, 0)) == expected
        batches, next_offset = reader.fetch_batches(stream_name, 1, end_offset=3)
        assert (values(batches), next_offset) == (expected[1:3], 3)
        batches, next_offset = reader.read_batches(stream_name, 0)
        assert all(b.schema == latest for b in batches)
        assert (values(batches), next_offset) == (expected, 4)
        ranged = list(reader.read_range(stream_name, 1, 4))
        assert all(b.schema == latest for b in ranged)
        assert values(ranged) == expected[1:]


def test_local_reads_decode_each_frame_in_its_version(client, stream_name):
    from npstream.client.local_reads import LocalSpans, iter_local

    expected = _two_versions(client, stream_name)
    located = client._locate(stream_name, 0, None, 100)
    assert located is not None, "the test broker runs on this machine"
    assert [v.version for v in located.response.value_schemas] == [1, 2]
    batches = [batch for batch, _after, _size in iter_local(LocalSpans(located.response, 0))]
    assert values(batches) == expected


def test_untyped_reads_are_unchanged(client, stream_name):
    client.create_stream(stream_name)
    client.publish(stream_name, {"a": 1})
    assert client.fetch(stream_name, 0).schema == MESSAGE_SCHEMA
    batches, _ = client.read_batches(stream_name, 0)
    assert batches[0].schema == MESSAGE_SCHEMA


def test_mismatch_in_a_later_request_says_where_that_request_starts(client, stream_name):
    import re

    client.create_stream(stream_name, schema="sensorId STRING NOT NULL, blob STRING")
    blob = "x" * 700_000  # ~5 rows per ~4 MiB request
    messages = [{"value": {"sensorId": f"s{i}", "blob": blob}} for i in range(11)]
    with pytest.raises(ValueMismatch) as caught:
        client.publish_batch(stream_name, [*messages, {"value": {"blob": "no id"}}])
    stored = client.stream_info(stream_name).end_offset
    assert 0 < stored < 11  # earlier requests stored, the failed one not
    index = int(re.search(r"message (\d+)", str(caught.value)).group(1))
    assert caught.value.__notes__[-1] == (
        "the message index in the error counts within the failed request, which starts at "
        f"row {stored} of this batch")
    assert stored + index == 11

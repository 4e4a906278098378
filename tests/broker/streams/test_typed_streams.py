"""Typed streams against a real broker process, over the wire: schemas, publish, reads, restarts."""

from __future__ import annotations

import json

import grpc
import pyarrow as pa
import pytest

from npstream.proto import metadata_keys, pb, pb_grpc
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.proto.value_schema import deserialize_schema, parse_schema, stored_schema

DDL = "sensorId STRING NOT NULL, reading FLOAT"
SPARK_JSON = json.dumps({"type": "struct", "fields": [
    {"name": "sensorId", "type": "string", "nullable": False, "metadata": {}},
    {"name": "reading", "type": "float", "nullable": True, "metadata": {}},
]})


@pytest.fixture(scope="module")
def channel(broker):
    with grpc.insecure_channel(broker.address) as channel:
        yield channel


@pytest.fixture(scope="module")
def stub(channel):
    return pb_grpc.StreamServiceStub(channel)


@pytest.fixture(scope="module")
def reads(channel):
    return pb_grpc.StreamReadServiceStub(channel)


@pytest.fixture
def name(stream_name):
    return stream_name


def rpc_error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    return info.value


def reason(error: grpc.RpcError) -> str:
    return dict(error.trailing_metadata() or ()).get(metadata_keys.REASON, "")


def arrow_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def publish_json(stub, stream, records, **fields) -> pb.PublishResponse:
    messages = [pb.Message(value=json.dumps(r).encode(), **fields) for r in records]
    return stub.Publish(pb.PublishRequest(stream=stream, messages=messages))


def publish_table(stub, stream, table) -> pb.PublishResponse:
    return stub.Publish(pb.PublishRequest(stream=stream, arrow_stream=arrow_bytes(table)))


def decoded(reply) -> pa.Table:
    schema = (pa.ipc.read_schema(pa.py_buffer(reply.stored_schema)) if reply.stored_schema
              else MESSAGE_SCHEMA)
    return pa.Table.from_batches(
        [pa.ipc.read_record_batch(pa.py_buffer(b), schema) for b in reply.batches], schema=schema)


def fetch(stub, stream, offset=0, **fields) -> tuple[pa.Table, pb.FetchResponse]:
    reply = stub.Fetch(pb.FetchRequest(stream=stream, offset=offset, **fields))
    return decoded(reply), reply


def create(stub, name, schema=DDL, **fields) -> pb.StreamInfo:
    return stub.CreateStream(pb.CreateStreamRequest(name=name, value_schema=schema, **fields))


# ---------------------------------------------------------------- schemas


def test_create_with_ddl_describes_version_1(stub, name):
    info = create(stub, name)
    assert [(v.version, v.ddl) for v in info.value_schemas] == [(1, DDL)]
    assert deserialize_schema(info.value_schemas[0].arrow_schema).equals(parse_schema(DDL))
    assert info.value_schemas[0].created_ms > 0
    described = stub.DescribeStream(pb.DescribeStreamRequest(name=name))
    assert list(described.value_schemas) == list(info.value_schemas)
    listed = stub.ListStreams(pb.ListStreamsRequest(prefix=name)).streams
    assert [list(s.value_schemas) for s in listed] == [list(info.value_schemas)]


def test_create_with_spark_json_is_the_same_schema(stub, name):
    info = create(stub, name, SPARK_JSON)
    assert [v.ddl for v in info.value_schemas] == [DDL]


def test_untyped_streams_have_no_schemas(stub, name):
    info = stub.CreateStream(pb.CreateStreamRequest(name=name))
    assert list(info.value_schemas) == []


@pytest.mark.parametrize(("text", "parts"), [
    ("sensorId STRING, reading FLOT", ["FLOT"]),
    ("sensorId STRING, sensorId INT", ["sensorId"]),
    ("a INTERVAL", ["INTERVAL"]),
    ('{"type": "struct", "fields": [', ["value schema of stream"]),
])
def test_refused_schema_names_what_is_wrong(stub, name, text, parts):
    error = rpc_error(stub.CreateStream, pb.CreateStreamRequest(name=name, value_schema=text))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(error) == "ERROR_REASON_SCHEMA_INVALID"
    assert name in error.details()
    for part in parts:
        assert part in error.details()
    assert rpc_error(stub.DescribeStream, pb.DescribeStreamRequest(name=name)).code() == (
        grpc.StatusCode.NOT_FOUND)  # nothing was created


def test_create_existing_with_another_schema_is_already_exists(stub, name):
    create(stub, name)
    same = create(stub, name, SPARK_JSON)  # the same schema, written differently
    assert [v.version for v in same.value_schemas] == [1]
    error = rpc_error(stub.CreateStream, pb.CreateStreamRequest(
        name=name, value_schema="sensorId STRING NOT NULL, reading DOUBLE"))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "value schema" in error.details() and "reading DOUBLE" in error.details()
    untyped = rpc_error(stub.CreateStream, pb.CreateStreamRequest(name=name))
    assert untyped.code() == grpc.StatusCode.ALREADY_EXISTS
    kept = create(stub, name, "x INT", exist_ok=True)
    assert [v.ddl for v in kept.value_schemas] == [DDL]


def test_update_evolves_compatible_changes_only(stub, name):
    create(stub, name)
    evolved = stub.UpdateStream(pb.UpdateStreamRequest(
        name=name, value_schema="sensorId STRING NOT NULL, reading DOUBLE, unit STRING"))
    assert [(v.version, v.ddl) for v in evolved.value_schemas] == [
        (1, DDL), (2, "sensorId STRING NOT NULL, reading DOUBLE, unit STRING")]
    same = stub.UpdateStream(pb.UpdateStreamRequest(
        name=name, value_schema="sensorId STRING NOT NULL, reading DOUBLE, unit STRING"))
    assert [v.version for v in same.value_schemas] == [1, 2]  # identical: no new version
    for text, field, rule in [
        ("sensorId STRING NOT NULL, reading DOUBLE", "unit", "removed"),
        ("sensorId STRING NOT NULL, reading FLOAT, unit STRING", "reading", "widened"),
        ("sensorId STRING NOT NULL, reading DOUBLE, unit STRING, n INT NOT NULL", "n",
         "nullable"),
    ]:
        error = rpc_error(stub.UpdateStream, pb.UpdateStreamRequest(name=name, value_schema=text))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason(error) == "ERROR_REASON_SCHEMA_INCOMPATIBLE"
        assert f"'{field}'" in error.details() and rule in error.details(), error.details()
    info = stub.DescribeStream(pb.DescribeStreamRequest(name=name))
    assert [v.version for v in info.value_schemas] == [1, 2]


def test_refused_schema_change_applies_no_config_change(stub, name):
    create(stub, name)
    error = rpc_error(stub.UpdateStream, pb.UpdateStreamRequest(
        name=name, value_schema="other INT", config=pb.StreamConfig(max_age_ms=1234)))
    assert reason(error) == "ERROR_REASON_SCHEMA_INCOMPATIBLE"
    assert stub.DescribeStream(pb.DescribeStreamRequest(name=name)).config.max_age_ms != 1234


def test_untyped_stream_becomes_typed_only_while_empty(stub, name):
    stub.CreateStream(pb.CreateStreamRequest(name=name))
    stub.Publish(pb.PublishRequest(stream=name, messages=[pb.Message(value=b"raw")]))
    error = rpc_error(stub.UpdateStream, pb.UpdateStreamRequest(name=name, value_schema=DDL))
    assert reason(error) == "ERROR_REASON_SCHEMA_INCOMPATIBLE"
    assert "1 untyped message" in error.details() and "holds no messages" in error.details()
    stub.DeleteMessages(pb.DeleteMessagesRequest(name=name))
    typed = stub.UpdateStream(pb.UpdateStreamRequest(name=name, value_schema=DDL))
    assert [v.version for v in typed.value_schemas] == [1]
    publish_json(stub, name, [{"sensorId": "a", "reading": 1.5}])
    table, reply = fetch(stub, name, 1)
    assert table.column("value").to_pylist() == [{"sensorId": "a", "reading": 1.5}]
    assert reply.schema_version == 1


def test_delete_drops_the_schemas(stub, name):
    create(stub, name)
    stub.DeleteStream(pb.DeleteStreamRequest(name=name))
    info = stub.CreateStream(pb.CreateStreamRequest(name=name))
    assert list(info.value_schemas) == []


# ---------------------------------------------------------------- publish and fetch


def test_publish_json_messages_and_fetch_exact_rows(stub, name):
    create(stub, name)
    reply = publish_json(stub, name, [{"sensorId": "s1", "reading": 21.5}, {"sensorId": "s2"}])
    assert (reply.first_offset, reply.stored_count) == (0, 2)
    table, fetched = fetch(stub, name)
    assert pa.ipc.read_schema(pa.py_buffer(fetched.stored_schema)).equals(
        stored_schema(parse_schema(DDL)))
    assert fetched.schema_version == 1
    assert table.column("value").to_pylist() == [{"sensorId": "s1", "reading": 21.5},
                                                 {"sensorId": "s2", "reading": None}]
    assert table.column("offset").to_pylist() == [0, 1]


def test_publish_arrow_struct_and_json_tables(stub, name):
    create(stub, name)
    struct = pa.table({
        "value": pa.array([{"sensorId": "a", "reading": 1.0}, {"sensorId": "b", "reading": None}],
                          pa.struct([("sensorId", pa.string()), ("reading", pa.float64())])),
        "id": ["i1", "i2"],
    })
    publish_table(stub, name, struct)
    publish_table(stub, name, pa.table({"value": pa.array([b'{"sensorId": "c"}'])}))
    table, _ = fetch(stub, name)
    assert [v["sensorId"] for v in table.column("value").to_pylist()] == ["a", "b", "c"]
    assert table.column("id").to_pylist()[:2] == ["i1", "i2"]


def test_mismatch_names_index_field_expected_and_stores_nothing(stub, name):
    create(stub, name)
    publish_json(stub, name, [{"sensorId": "ok"}])
    error = rpc_error(stub.Publish, pb.PublishRequest(stream=name, messages=[
        pb.Message(value=b'{"sensorId": "a"}'),
        pb.Message(value=b'{"sensorId": "b", "reading": "hot"}'),
    ]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(error) == "ERROR_REASON_VALUE_MISMATCH"
    details = error.details()
    assert "message 1" in details and "'reading'" in details and "FLOAT" in details
    missing = rpc_error(stub.Publish, pb.PublishRequest(
        stream=name, arrow_stream=arrow_bytes(pa.table({"value": pa.array([
            {"reading": 1.0}], pa.struct([("reading", pa.float64())]))}))))
    assert reason(missing) == "ERROR_REASON_VALUE_MISMATCH"
    assert "message 0" in missing.details() and "'sensorId'" in missing.details()
    extra = rpc_error(stub.Publish, pb.PublishRequest(stream=name, messages=[
        pb.Message(value=b'{"sensorId": "a", "color": "red"}')]))
    assert "'color'" in extra.details()
    assert stub.DescribeStream(pb.DescribeStreamRequest(name=name)).end_offset == 1


def test_max_message_bytes_bounds_typed_values(stub, name):
    create(stub, name, config=pb.StreamConfig(max_message_bytes=16))
    publish_json(stub, name, [{"sensorId": "0123456789ab", "reading": 1}])  # 12 + 4 bytes
    error = rpc_error(stub.Publish, pb.PublishRequest(stream=name, messages=[
        pb.Message(value=json.dumps({"sensorId": "0123456789abc", "reading": 1}).encode())]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(error) == "ERROR_REASON_MESSAGE_TOO_LARGE"
    assert "17" in error.details()


def test_dedup_by_id_on_a_typed_stream(stub, name):
    create(stub, name, config=pb.StreamConfig(dedup_window_ms=60_000))
    first = publish_json(stub, name, [{"sensorId": "a"}], id="r1")
    again = publish_json(stub, name, [{"sensorId": "a"}], id="r1")
    assert first.stored_count == 1 and again.stored_count == 0
    assert [(d.index, d.offset) for d in again.duplicates] == [(0, 0)]


def test_reads_across_versions_give_the_latest_fields(stub, reads, name):
    create(stub, name)
    publish_json(stub, name, [{"sensorId": "old", "reading": 1.5}, {"sensorId": "old2"}])
    stub.UpdateStream(pb.UpdateStreamRequest(
        name=name, value_schema="sensorId STRING NOT NULL, reading DOUBLE, unit STRING"))
    publish_json(stub, name, [{"sensorId": "new", "reading": 1e300, "unit": "C"}])
    expected = [{"sensorId": "old", "reading": 1.5, "unit": None},
                {"sensorId": "old2", "reading": None, "unit": None},
                {"sensorId": "new", "reading": 1e300, "unit": "C"}]
    table, reply = fetch(stub, name)
    assert reply.schema_version == 2
    assert table.column("value").to_pylist() == expected
    cut, _ = fetch(stub, name, 1, max_messages=1)
    assert cut.column("value").to_pylist() == expected[1:2]
    replies = list(reads.ReadRange(pb.FetchRequest(stream=name, offset=0, end_offset=3)))
    ranged = pa.concat_tables([decoded(r) for r in replies if r.batches])
    assert ranged.column("value").to_pylist() == expected
    located = reads.Locate(pb.FetchRequest(stream=name, offset=0))
    assert [v.version for v in located.value_schemas] == [1, 2]


def test_untyped_fetch_replies_are_unchanged(stub, name):
    stub.CreateStream(pb.CreateStreamRequest(name=name))
    stub.Publish(pb.PublishRequest(stream=name, messages=[pb.Message(value=b"x")]))
    _, reply = fetch(stub, name)
    assert (reply.stored_schema, reply.schema_version) == (b"", 0)


def test_kill_and_restart_keeps_schemas_and_data(broker_factory, tmp_path):
    broker = broker_factory("typed-restart")
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        create(stub, "typed", config=pb.StreamConfig(dedup_window_ms=60_000))
        publish_json(stub, "typed", [{"sensorId": "a", "reading": 1}], id="x")
        stub.UpdateStream(pb.UpdateStreamRequest(
            name="typed", value_schema="sensorId STRING NOT NULL, reading DOUBLE, unit STRING"))
        publish_json(stub, "typed", [{"sensorId": "b", "unit": "K"}], id="y")
    broker.restart(hard=True)
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        info = stub.DescribeStream(pb.DescribeStreamRequest(name="typed"))
        assert [v.version for v in info.value_schemas] == [1, 2]
        table, reply = fetch(stub, "typed")
        assert reply.schema_version == 2
        assert table.column("value").to_pylist() == [
            {"sensorId": "a", "reading": 1.0, "unit": None},
            {"sensorId": "b", "reading": None, "unit": "K"}]
        again = publish_json(stub, "typed", [{"sensorId": "a"}], id="x")  # dedup rebuilt
        assert again.stored_count == 0


# ---------------------------------------------------------------- groups
# (sink writes into typed streams: tests/broker/sink/test_typed_sink.py)


def test_group_deliveries_carry_json_records(client, name):
    client.create_stream(name, schema=DDL)
    client.publish(name, {"sensorId": "s1", "reading": 2.5})
    client.publish(name, {"sensorId": "s2"})
    (first, second) = client.receive(name, "workers", max=2, wait=5)
    assert json.loads(first.value) == {"sensorId": "s1", "reading": 2.5}
    assert json.loads(second.value) == {"sensorId": "s2", "reading": None}
    pulled = client.consumer(name, "cursor").pull(limit=10)
    assert pulled.table.schema == MESSAGE_SCHEMA
    assert [m.json() for m in pulled] == [{"sensorId": "s1", "reading": 2.5},
                                          {"sensorId": "s2", "reading": None}]

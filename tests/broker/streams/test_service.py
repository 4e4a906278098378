"""StreamService against a real broker process: every RPC, its replies and its error codes."""

from __future__ import annotations

import statistics
import threading
import time
import uuid

import grpc
import pyarrow as pa
import pytest

from npstream.proto import pb, pb_grpc
from npstream.proto.schema import MESSAGE_SCHEMA

DEFAULT_CONFIG = pb.StreamConfig(max_age_ms=7 * 86_400_000, max_bytes=1 << 30,
                                 dedup_window_ms=120_000, max_message_bytes=1 << 20)


@pytest.fixture(scope="module")
def stub(broker):
    with grpc.insecure_channel(broker.address) as channel:
        yield pb_grpc.StreamServiceStub(channel)


@pytest.fixture
def name(stream_name):
    return stream_name


def rpc_error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    return info.value


def publish(stub, stream, values, **fields) -> pb.PublishResponse:
    messages = [pb.Message(value=v) for v in values]
    return stub.Publish(pb.PublishRequest(stream=stream, messages=messages, **fields))


def arrow_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def fetch_table(stub, stream, offset, **fields) -> tuple[pa.Table, pb.FetchResponse]:
    reply = stub.Fetch(pb.FetchRequest(stream=stream, offset=offset, **fields))
    batches = [pa.ipc.read_record_batch(pa.py_buffer(b), MESSAGE_SCHEMA) for b in reply.batches]
    return pa.Table.from_batches(batches, schema=MESSAGE_SCHEMA), reply


# ---------------------------------------------------------------- admin


def test_create_stream_new_name_returns_effective_defaults(stub, name):
    before = int(time.time() * 1000)
    info = stub.CreateStream(pb.CreateStreamRequest(name=name))
    assert info.name == name
    assert info.config == DEFAULT_CONFIG
    assert (info.start_offset, info.end_offset, info.message_count) == (0, 0, 0)
    assert before - 1000 <= info.created_ms <= int(time.time() * 1000) + 1000
    assert info.error == ""


def test_create_stream_same_config_twice_succeeds_and_different_config_is_already_exists(
        stub, name):
    config = pb.StreamConfig(max_age_ms=60_000)
    first = stub.CreateStream(pb.CreateStreamRequest(name=name, config=config))
    again = stub.CreateStream(pb.CreateStreamRequest(name=name, config=config))
    assert again.created_ms == first.created_ms
    # Spelling out a default explicitly is the same effective config.
    explicit = pb.StreamConfig(max_age_ms=60_000, max_bytes=1 << 30)
    stub.CreateStream(pb.CreateStreamRequest(name=name, config=explicit))
    err = rpc_error(stub.CreateStream, pb.CreateStreamRequest(
        name=name, config=pb.StreamConfig(max_age_ms=1000)))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert f"stream '{name}' already exists with a different config" in err.details()
    kept = stub.CreateStream(pb.CreateStreamRequest(
        name=name, config=pb.StreamConfig(max_age_ms=1000), exist_ok=True))
    assert kept.config.max_age_ms == 60_000


@pytest.mark.parametrize("bad", ["", ".hidden", "..", "a/b", "../etc", "x" * 256, "sp ace",
                                 "-dash-first"])
def test_create_stream_invalid_name_is_invalid_argument_naming_the_rule(stub, bad):
    err = rpc_error(stub.CreateStream, pb.CreateStreamRequest(name=bad))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"invalid stream name {bad!r}" in err.details()
    assert "[A-Za-z0-9._-]" in err.details()


def test_create_stream_bad_config_values_are_invalid_argument(stub, name):
    err = rpc_error(stub.CreateStream, pb.CreateStreamRequest(
        name=name, config=pb.StreamConfig(max_bytes=-1)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (f"CreateStreamRequest.config.max_bytes=-1 is out of range: accepted "
            f"0..9223372036854775807; 0 = unlimited / off (stream '{name}')") == err.details()
    err = rpc_error(stub.CreateStream, pb.CreateStreamRequest(
        name=name, config=pb.StreamConfig(max_message_bytes=64 << 20)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_message_bytes=67108864" in err.details() and "1..33554432" in err.details()
    assert rpc_error(stub.DescribeStream, pb.DescribeStreamRequest(name=name)).code() == (
        grpc.StatusCode.NOT_FOUND)


def test_describe_stream_after_publishes_reports_offsets_count_bytes_and_times(stub, name):
    stub.CreateStream(pb.CreateStreamRequest(name=name))
    before = int(time.time() * 1000)
    publish(stub, name, [b"a", b"b"])
    publish(stub, name, [b"c"])
    info = stub.DescribeStream(pb.DescribeStreamRequest(name=name))
    assert (info.start_offset, info.end_offset, info.message_count) == (0, 3, 3)
    assert info.bytes_on_disk > 0
    assert info.segment_count >= 1
    assert before - 1000 <= info.first_timestamp_ms <= info.last_timestamp_ms
    assert info.last_timestamp_ms <= int(time.time() * 1000) + 1000
    assert info.config == DEFAULT_CONFIG


def test_describe_stream_missing_is_not_found_naming_it(stub, name):
    err = rpc_error(stub.DescribeStream, pb.DescribeStreamRequest(name=name))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details() == f"stream '{name}' does not exist"


def test_list_streams_prefix_pattern_and_pages_cover_each_stream_once(stub):
    prefix = f"ls-{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}.{kind}-{i}" for kind in ("orders", "users") for i in range(3)]
    for n in names:
        stub.CreateStream(pb.CreateStreamRequest(name=n))
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        reply = stub.ListStreams(pb.ListStreamsRequest(prefix=prefix, page_size=4,
                                                       page_token=token))
        seen += [s.name for s in reply.streams]
        pages += 1
        token = reply.next_page_token
        if not token:
            break
    assert seen == sorted(names) and pages == 2
    reply = stub.ListStreams(pb.ListStreamsRequest(pattern=f"{prefix}.users-*"))
    assert [s.name for s in reply.streams] == sorted(n for n in names if ".users-" in n)
    assert all(s.config == DEFAULT_CONFIG for s in reply.streams)
    reply = stub.ListStreams(pb.ListStreamsRequest(prefix=prefix, pattern="*-[02]"))
    assert len(reply.streams) == 4
    err = rpc_error(stub.ListStreams, pb.ListStreamsRequest(page_token="%%%"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid page_token" in err.details()


def test_update_stream_changes_only_the_given_fields(stub, name):
    stub.CreateStream(pb.CreateStreamRequest(name=name, config=pb.StreamConfig(max_bytes=5000)))
    info = stub.UpdateStream(pb.UpdateStreamRequest(
        name=name, config=pb.StreamConfig(dedup_window_ms=0)))
    assert info.config.dedup_window_ms == 0
    assert info.config.max_bytes == 5000
    assert info.config.max_age_ms == DEFAULT_CONFIG.max_age_ms
    # With dedup off, the same id is stored twice.
    msg = pb.Message(id="same", value=b"v")
    stub.Publish(pb.PublishRequest(stream=name, messages=[msg]))
    reply = stub.Publish(pb.PublishRequest(stream=name, messages=[msg]))
    assert (reply.first_offset, reply.stored_count, len(reply.duplicates)) == (1, 1, 0)
    err = rpc_error(stub.UpdateStream, pb.UpdateStreamRequest(name=name + "-nope"))
    assert err.code() == grpc.StatusCode.NOT_FOUND


def test_delete_stream_removes_it_and_recreate_starts_at_zero(stub, name):
    publish(stub, name, [b"1", b"2"])
    assert stub.DeleteStream(pb.DeleteStreamRequest(name=name)).deleted is True
    assert stub.DeleteStream(pb.DeleteStreamRequest(name=name)).deleted is False
    err = rpc_error(stub.Fetch, pb.FetchRequest(stream=name, offset=0))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert publish(stub, name, [b"new"]).first_offset == 0
    table, _ = fetch_table(stub, name, 0)
    assert table.column("value").to_pylist() == [b"new"]


def test_delete_messages_before_offset_moves_start_and_all_empties(stub, name):
    publish(stub, name, [bytes([i]) for i in range(10)])
    info = stub.DeleteMessages(pb.DeleteMessagesRequest(name=name, before_offset=4))
    assert (info.start_offset, info.end_offset, info.message_count) == (4, 10, 6)
    table, _ = fetch_table(stub, name, 4)
    assert table.column("offset").to_pylist() == list(range(4, 10))
    err = rpc_error(stub.Fetch, pb.FetchRequest(stream=name, offset=3))
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE
    # Lower than start: nothing changes.
    assert stub.DeleteMessages(pb.DeleteMessagesRequest(name=name, before_offset=2)
                               ).start_offset == 4
    err = rpc_error(stub.DeleteMessages, pb.DeleteMessagesRequest(name=name, before_offset=11))
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "offset 11 is out of range" in err.details() and "end_offset=10" in err.details()
    info = stub.DeleteMessages(pb.DeleteMessagesRequest(name=name))
    assert (info.start_offset, info.end_offset, info.message_count) == (10, 10, 0)
    assert publish(stub, name, [b"after"]).first_offset == 10


def test_repair_stream_healthy_cuts_nothing(stub, name):
    publish(stub, name, [b"x"])
    reply = stub.RepairStream(pb.RepairStreamRequest(name=name))
    assert reply.truncated_bytes == 0
    assert (reply.stream.end_offset, reply.stream.error) == (1, "")
    assert publish(stub, name, [b"y"]).first_offset == 1
    err = rpc_error(stub.RepairStream, pb.RepairStreamRequest(name=name + "-nope"))
    assert err.code() == grpc.StatusCode.NOT_FOUND


# ---------------------------------------------------------------- publish / fetch


def test_publish_messages_assigns_dense_offsets_and_fetch_returns_exact_rows(stub, name):
    first = stub.Publish(pb.PublishRequest(stream=name, messages=[
        pb.Message(id="m1", key=b"k1", value=b"v1", headers={"h": b"1"}),
        pb.Message(value=b"v2"),
    ]))
    assert (first.first_offset, first.stored_count, list(first.duplicates)) == (0, 2, [])
    assert first.timestamp_ms > 0
    second = publish(stub, name, [b"v3"], ack=pb.ACK_WRITE)
    assert (second.first_offset, second.stored_count) == (2, 1)
    table, reply = fetch_table(stub, name, 0)
    assert (reply.next_offset, reply.count, reply.start_offset, reply.end_offset) == (3, 3, 0, 3)
    assert table.column("offset").to_pylist() == [0, 1, 2]
    assert table.column("value").to_pylist() == [b"v1", b"v2", b"v3"]
    assert table.column("key").to_pylist() == [b"k1", None, None]
    assert table.column("headers").to_pylist()[0] == [("h", b"1")]
    ids = table.column("id").to_pylist()
    assert ids[0] == "m1" and ids[1] and ids[2] and len(set(ids)) == 3
    stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
    assert stamps == sorted(stamps) and stamps[0] == first.timestamp_ms


def test_publish_arrow_stream_with_string_values_stores_utf8_bytes(stub, name):
    data = pa.table({"value": ["\u00e9t\u00e9", "b"], "key": ["k", None], "id": ["", "given"]})
    reply = stub.Publish(pb.PublishRequest(stream=name, arrow_stream=arrow_bytes(data),
                                           ack=pb.ACK_FSYNC))
    assert (reply.first_offset, reply.stored_count) == (0, 2)
    table, _ = fetch_table(stub, name, 0)
    assert table.column("value").to_pylist() == ["\u00e9t\u00e9".encode(), b"b"]
    assert table.column("key").to_pylist() == [b"k", None]
    ids = table.column("id").to_pylist()
    assert ids[1] == "given" and ids[0] not in ("", None)  # empty id = broker assigns one


def test_publish_duplicate_id_within_window_reports_the_original_offset(stub, name):
    publish(stub, name, [b"zero"])
    stub.Publish(pb.PublishRequest(stream=name, messages=[pb.Message(id="order-1", value=b"a")]))
    reply = stub.Publish(pb.PublishRequest(stream=name, messages=[
        pb.Message(id="order-2", value=b"b"), pb.Message(id="order-1", value=b"a-again"),
    ]))
    assert (reply.first_offset, reply.stored_count) == (2, 1)
    assert [(d.index, d.offset) for d in reply.duplicates] == [(1, 1)]
    table, _ = fetch_table(stub, name, 0)
    assert table.column("value").to_pylist() == [b"zero", b"a", b"b"]


def test_publish_oversized_message_is_invalid_argument_and_stores_nothing(stub, name):
    stub.CreateStream(pb.CreateStreamRequest(
        name=name, config=pb.StreamConfig(max_message_bytes=1000)))
    err = rpc_error(stub.Publish, pb.PublishRequest(stream=name, messages=[
        pb.Message(value=b"ok"), pb.Message(value=b"x" * 2000)]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"message 1 for stream '{name}'" in err.details()
    assert "max_message_bytes=1000" in err.details() and "nothing was stored" in err.details()
    info = stub.DescribeStream(pb.DescribeStreamRequest(name=name))
    assert info.end_offset == 0
    # Above the default limit (1 MiB) on an auto-created stream, too.
    err = rpc_error(stub.Publish, pb.PublishRequest(stream=name + "-auto", messages=[
        pb.Message(value=b"x" * ((1 << 20) + 1))]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert stub.EndOffsets(pb.EndOffsetsRequest(streams=[name + "-auto"])
                           ).streams[0].end_offset == 0


@pytest.mark.parametrize(("fields", "expected"), [
    ({"arrow_stream": b"not arrow"}, "is not a valid Arrow IPC stream"),
    ({"arrow_stream": arrow_bytes(pa.table({"payload": [b"x"]}))}, "unknown publish column"),
    ({"arrow_stream": arrow_bytes(pa.table({"value": pa.array([b"x", None])}))},
     "publish column 'value' has 1 null(s)"),
    ({"arrow_stream": arrow_bytes(pa.table({"value": [b"x"]})),
      "messages": [pb.Message(value=b"y")]}, "sets both messages and arrow_stream"),
])
def test_publish_bad_request_is_invalid_argument_and_stores_nothing(stub, name, fields,
                                                                     expected):
    stub.CreateStream(pb.CreateStreamRequest(name=name))
    err = rpc_error(stub.Publish, pb.PublishRequest(stream=name, **fields))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in err.details() and name in err.details()
    assert stub.DescribeStream(pb.DescribeStreamRequest(name=name)).end_offset == 0


def test_publish_to_missing_stream_auto_creates_it_by_default(stub, name):
    reply = publish(stub, name, [b"x"])
    assert reply.first_offset == 0
    assert stub.DescribeStream(pb.DescribeStreamRequest(name=name)).config == DEFAULT_CONFIG


def test_publish_invalid_stream_name_is_invalid_argument(stub):
    err = rpc_error(stub.Publish, pb.PublishRequest(stream="../../etc/passwd",
                                                    messages=[pb.Message(value=b"x")]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid stream name" in err.details()


def test_fetch_with_end_offset_and_limits_returns_exactly_the_range(stub, name):
    publish(stub, name, [str(i).encode() for i in range(20)])
    table, reply = fetch_table(stub, name, 5, end_offset=12)
    assert table.column("offset").to_pylist() == list(range(5, 12))
    assert reply.next_offset == 12 and reply.end_offset == 20
    table, reply = fetch_table(stub, name, 5, max_messages=3)
    assert table.column("offset").to_pylist()[:3] == [5, 6, 7]
    assert reply.next_offset == 5 + reply.count and reply.count >= 3
    table, reply = fetch_table(stub, name, 20)
    assert (table.num_rows, reply.next_offset) == (0, 20)
    err = rpc_error(stub.Fetch, pb.FetchRequest(stream=name, offset=5, end_offset=4))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = rpc_error(stub.Fetch, pb.FetchRequest(stream=name, offset=0, max_messages=-1))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "FetchRequest.max_messages=-1 is out of range: accepted 0..2147483647" in err.details()


def test_fetch_offset_past_end_is_out_of_range_with_offset_metadata(stub, name):
    publish(stub, name, [b"a", b"b"])
    err = rpc_error(stub.Fetch, pb.FetchRequest(stream=name, offset=7))
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE
    assert err.details() == (f"offset 7 is out of range for stream '{name}': "
                             "start_offset=0, end_offset=2")
    meta = dict(err.trailing_metadata())
    assert meta["x-npstream-stream"] == name
    assert (meta["x-npstream-offset"], meta["x-npstream-start-offset"],
            meta["x-npstream-end-offset"]) == ("7", "0", "2")


def test_fetch_missing_stream_is_not_found_and_does_not_create_it(stub, name):
    err = rpc_error(stub.Fetch, pb.FetchRequest(stream=name, offset=0, wait_ms=10))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert rpc_error(stub.DescribeStream, pb.DescribeStreamRequest(name=name)).code() == (
        grpc.StatusCode.NOT_FOUND)


def test_fetch_long_poll_wakes_within_50ms_of_a_publish(stub, name):
    stub.CreateStream(pb.CreateStreamRequest(name=name))
    delays: list[float] = []
    for i in range(5):
        result: dict[str, object] = {}

        def poll(offset: int = i, out: dict[str, object] = result) -> None:
            out["reply"] = stub.Fetch(pb.FetchRequest(stream=name, offset=offset, wait_ms=10_000))
            out["at"] = time.perf_counter()

        thread = threading.Thread(target=poll)
        thread.start()
        time.sleep(0.3)  # the poll is parked at the end of the stream
        assert "reply" not in result
        published = time.perf_counter()
        publish(stub, name, [b"wake"], ack=pb.ACK_WRITE)
        thread.join(5)
        reply = result["reply"]
        assert isinstance(reply, pb.FetchResponse) and reply.count == 1
        delays.append(result["at"] - published)  # type: ignore[operator]
    assert statistics.median(delays) < 0.05, delays


def test_fetch_long_poll_without_data_returns_empty_after_wait(stub, name):
    publish(stub, name, [b"a"])
    started = time.perf_counter()
    table, reply = fetch_table(stub, name, 1, wait_ms=300)
    elapsed = time.perf_counter() - started
    assert table.num_rows == 0 and reply.next_offset == 1
    assert 0.25 <= elapsed < 3.0


def test_offset_for_timestamp_returns_first_offset_at_or_after(stub, name):
    publish(stub, name, [b"a"])
    time.sleep(0.02)
    middle = publish(stub, name, [b"b", b"c"])
    time.sleep(0.02)
    last = publish(stub, name, [b"d"])

    def lookup(ts: int) -> int:
        return stub.OffsetForTimestamp(pb.OffsetForTimestampRequest(
            stream=name, timestamp_ms=ts)).offset

    assert lookup(0) == 0
    assert lookup(middle.timestamp_ms) == 1
    assert lookup(last.timestamp_ms) == 3
    assert lookup(last.timestamp_ms + 60_000) == 4
    err = rpc_error(stub.OffsetForTimestamp, pb.OffsetForTimestampRequest(
        stream=name + "-nope", timestamp_ms=0))
    assert err.code() == grpc.StatusCode.NOT_FOUND


def test_end_offsets_by_names_and_pattern_in_one_call(stub):
    prefix = f"eo-{uuid.uuid4().hex[:6]}"
    for i, count in enumerate([1, 3, 0]):
        stub.CreateStream(pb.CreateStreamRequest(name=f"{prefix}-{i}"))
        if count:
            publish(stub, f"{prefix}-{i}", [b"x"] * count)
    stub.DeleteMessages(pb.DeleteMessagesRequest(name=f"{prefix}-1", before_offset=2))
    reply = stub.EndOffsets(pb.EndOffsetsRequest(pattern=f"{prefix}-*"))
    assert sorted((s.stream, s.start_offset, s.end_offset) for s in reply.streams) == [
        (f"{prefix}-0", 0, 1), (f"{prefix}-1", 2, 3), (f"{prefix}-2", 0, 0)]
    reply = stub.EndOffsets(pb.EndOffsetsRequest(streams=[f"{prefix}-2", f"{prefix}-0"],
                                                 pattern=f"{prefix}-0"))
    assert [(s.stream, s.end_offset) for s in reply.streams] == [
        (f"{prefix}-2", 0), (f"{prefix}-0", 1)]
    err = rpc_error(stub.EndOffsets, pb.EndOffsetsRequest(streams=[f"{prefix}-9"]))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert f"stream '{prefix}-9' does not exist" in err.details()

"""Hostile input: every RPC of a live broker fuzzed with Hypothesis (issue 18).

Each RPC gets requests built from its message type with hostile field values
(names with path traversal, control characters, unicode, 0 and 10,000
characters; negative and huge offsets, sizes and wait times; unknown enum
values; malformed, truncated and wrong-schema Arrow payloads), sent as wire
bytes through a generic gRPC channel so that the bytes themselves can be
truncated, corrupted or replaced by garbage, with hostile metadata beside
them (oversized values, junk tokens and member ids). What must hold:

* every call ends with a proper status: OK or a code the broker chose; never
  UNKNOWN, and never INTERNAL (the broker's "this is a bug");
* the broker process stays alive and serving (checked after every example,
  health-checked after every batch);
* no stream is damaged: after every batch each stream reads back from start
  to end with contiguous offsets, and at the end of the module the segment
  files are walked frame by frame (CRC32C) with the broker stopped, and read
  back again after a restart.

The same fuzzing runs a second time against a broker with a tokens file
(``test_fuzz_rpc_with_tokens``): each call carries one of several tokens,
limited to some stream globs, an unknown one or none, so the authorization
path takes the same hostile requests. There a call without a known token
must end UNAUTHENTICATED (gRPC's RESOURCE_EXHAUSTED for oversized metadata
comes first), and a known token is never UNAUTHENTICATED.

``NPSTREAM_FUZZ_EXAMPLES`` sets the examples per RPC (default 12, which
keeps the module well under a minute on the 2-core dev machine); for a
longer hunt run e.g. ``NPSTREAM_FUZZ_EXAMPLES=500 .venv/bin/python -m pytest
tests/broker/rpc/test_hostile_input.py``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pyarrow as pa
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from integrity import check_files, check_streams

from harness import BrokerProcess
from npstream import Client
from npstream.proto import field_ranges, pb

EXAMPLES = int(os.environ.get("NPSTREAM_FUZZ_EXAMPLES", "12"))
CALL_TIMEOUT_S = 20.0
STREAM_TIMEOUT_S = 5.0

UNTYPED, TYPED = "fz-plain", "fz-typed"
TYPED_SCHEMA = "a INT, b STRING"
GROUP, SINK = "fz-group", "fz-sink"

# Codes a call may end with. UNKNOWN (an exception gRPC could not map) and
# INTERNAL (the broker's own "bug") are never acceptable. DEADLINE_EXCEEDED
# is for the streaming calls this test cuts off (Subscribe waits for credits).
ALLOWED = {
    grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.UNIMPLEMENTED,
}
STREAMING_ALLOWED = ALLOWED | {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)

# ---------------------------------------------------------------- values

# The bounds of npstream.proto.field_ranges' rules, and one past each, besides the types'.
RULE_EDGES = sorted({edge for rule in field_ranges.RANGES.values()
                     for edge in (rule.low - 1, rule.low, rule.high, rule.high + 1)
                     if -(2**63) <= edge < 2**63})
I64 = st.one_of(
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**32, 2**53, 2**63 - 1, -(2**63), -(2**31)]),
    st.sampled_from(RULE_EDGES), st.integers(-10, 10_000), st.integers(-(2**63), 2**63 - 1))
I32 = st.one_of(st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31), 10_000, 100_000]),
                st.sampled_from([e for e in RULE_EDGES if -(2**31) <= e < 2**31]),
                st.integers(-(2**31), 2**31 - 1))
U64 = st.one_of(st.sampled_from([0, 1, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1))
# Wait times: mostly short, sometimes huge (the broker caps them at max_fetch_wait).
WAIT = st.one_of(st.sampled_from([0, 1, 50, -1, -(2**63), 2**63 - 1]), st.integers(0, 300))

BOUNDARY_NAMES = [
    "", ".", "..", "../..", "../../etc/passwd", "/etc/passwd", "a/b", "a\\b", "a\x00b",
    "\x00", "\n", " ", "-a", "_a", ".hidden", "a" * 255, "a" * 256, "x" * 10_000, "*", "?",
    "[a-z]", "é", "流", "\U0001f600", "a b", "a\tb", "\x7f", "CON", "a" * 254 + "é",
    UNTYPED + "\x00", UNTYPED + "/..", UNTYPED.upper(),
]
KNOWN_NAMES = [UNTYPED, TYPED, "fz-new-1", "fz-new-2", f"{UNTYPED}.dlq"]
NAMES = st.one_of(st.sampled_from(KNOWN_NAMES), st.sampled_from(KNOWN_NAMES),
                  st.sampled_from(BOUNDARY_NAMES), st.text(max_size=40),
                  st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True))
GROUPS = st.one_of(st.just(GROUP), st.sampled_from(BOUNDARY_NAMES), st.text(max_size=20),
                   st.just("g2"))
PATTERNS = st.one_of(st.sampled_from(["*", "", "fz-*", "[", "[!", "**", "\\", "x" * 10_000]),
                     st.text(max_size=20))
BLOBS = st.one_of(st.binary(max_size=64), st.sampled_from([b"", b"\x00" * 1000]))


@st.composite
def _tables(draw: st.DrawFn) -> pa.Table:
    """A message table: mostly the right columns, often the wrong types or extra columns."""
    rows = draw(st.integers(0, 5))
    columns: dict[str, pa.Array] = {}
    value_kind = draw(st.sampled_from(["binary", "string", "int", "struct", "bad-struct",
                                       "json", "missing", "big", "null"]))
    if value_kind == "binary":
        columns["value"] = pa.array(draw(st.lists(BLOBS, min_size=rows, max_size=rows)),
                                    pa.binary())
    elif value_kind == "string":
        columns["value"] = pa.array(draw(st.lists(st.text(max_size=20), min_size=rows,
                                                  max_size=rows)), pa.string())
    elif value_kind == "int":
        columns["value"] = pa.array(list(range(rows)), pa.int64())
    elif value_kind == "struct":
        columns["value"] = pa.array([{"a": i, "b": str(i)} for i in range(rows)],
                                    pa.struct([("a", pa.int32()), ("b", pa.string())]))
    elif value_kind == "bad-struct":
        columns["value"] = pa.array([{"a": "x", "zz": [1.5]} for _ in range(rows)])
    elif value_kind == "json":
        columns["value"] = pa.array(draw(st.lists(
            st.sampled_from([b'{"a": 1, "b": "x"}', b'{"a": "no"}', b"[1]", b"{", b"null",
                             b'{"a": 99999999999}', b'{"b": "\\u0000"}']),
            min_size=rows, max_size=rows)), pa.binary())
    elif value_kind == "big":
        rows = 1
        columns["value"] = pa.array([b"v" * draw(st.sampled_from([(1 << 20) + 1, 3 << 20]))])
    elif value_kind == "null":
        columns["value"] = pa.nulls(rows, pa.binary())
    if draw(st.booleans()):
        columns["id"] = pa.array(draw(st.lists(st.sampled_from(["", "id-1", "id-1", "é", "\x00"]),
                                               min_size=rows, max_size=rows)))
    if draw(st.booleans()):
        columns["id"] = pa.array(list(range(rows)), pa.int32())  # wrong type
    if draw(st.booleans()):
        columns["key"] = pa.array(draw(st.lists(st.one_of(st.none(), BLOBS), min_size=rows,
                                                max_size=rows)), pa.binary())
    if draw(st.booleans()):
        columns["headers"] = pa.array([[("h", b"v")] if i % 2 else None for i in range(rows)],
                                      pa.map_(pa.string(), pa.binary()))
    if draw(st.booleans()):
        columns["headers"] = pa.array(["not a map"] * rows)  # wrong type
    if draw(st.booleans()):
        columns["stream"] = pa.array(draw(st.lists(NAMES, min_size=rows, max_size=rows)),
                                     pa.string())
    if draw(st.booleans()):
        columns["offset"] = pa.array([-1] * rows, pa.int64())  # a column nobody may set
    return pa.table(columns) if columns else pa.table({"x": pa.array([], pa.int8())})


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


ARROW = st.one_of(
    _tables().map(_ipc),
    st.tuples(_tables().map(_ipc), st.integers(0, 400)).map(lambda t: t[0][: t[1]]),  # truncated
    st.tuples(_tables().map(_ipc), st.integers(0, 10_000), st.integers(1, 255)).map(
        lambda t: _flip(t[0], t[1], t[2])),
    st.binary(max_size=200),
    st.just(b""),
    st.just(b"\xff\xff\xff\xff" + b"\x7f\xff\xff\xff" + b"\x00" * 64),  # huge metadata length
)


def _flip(data: bytes, position: int, xor: int) -> bytes:
    if not data:
        return data
    position %= len(data)
    return data[:position] + bytes([data[position] ^ xor]) + data[position + 1:]


START_FROM = st.one_of(
    st.builds(pb.StartFrom), st.builds(pb.StartFrom, earliest=st.booleans()),
    st.builds(pb.StartFrom, latest=st.booleans()), st.builds(pb.StartFrom, offset=I64),
    st.builds(pb.StartFrom, timestamp_ms=I64))
SHARED_CONFIG = st.builds(
    pb.SharedGroupConfig, ack_wait_ms=I64, max_deliver=I32,
    backoff_ms=st.lists(I64, max_size=3), dead_letter_stream=NAMES, start_from=START_FROM,
    ordering=st.sampled_from([0, 1, 2, 3, 77, -5]))
RANGES = st.lists(st.builds(pb.OffsetRange, start=I64, end=I64), max_size=4)
OFFSETS = st.lists(I64, max_size=5)
STREAM_CONFIG = st.builds(
    pb.StreamConfig, **{f: st.one_of(st.none(), I64) for f in
                        ("max_age_ms", "max_bytes", "dedup_window_ms", "max_message_bytes")})
SCHEMAS = st.sampled_from(["", TYPED_SCHEMA, "a INT, b STRING, c DOUBLE", "a STRING",
                           "nonsense (", "a MAP<STRING, INT>", "a INT NOT NULL", "x" * 10_000])
STAGING_IDS = st.one_of(st.sampled_from(["s-0", "s-1", "", "../x", "a/b", "é"]),
                        st.text(max_size=10))
FETCH = st.builds(pb.FetchRequest, stream=NAMES, offset=I64, max_messages=I32,
                  max_bytes=I64, wait_ms=WAIT, end_offset=I64)
MESSAGES = st.lists(st.builds(pb.Message, id=st.text(max_size=10), value=BLOBS,
                              key=st.one_of(st.none(), BLOBS),
                              headers=st.dictionaries(st.text(max_size=5), BLOBS, max_size=2)),
                    max_size=4)
PUBLISH = st.builds(pb.PublishRequest, stream=NAMES, messages=MESSAGES,
                    arrow_stream=st.one_of(st.just(b""), ARROW), ack=st.sampled_from([0, 1, 2, 9]))
RECEIVE = st.builds(pb.ReceiveRequest, stream=NAMES, group=GROUPS,
                    member_id=st.one_of(st.just(""), st.text(max_size=20)), max_messages=I32,
                    wait_ms=WAIT, config=SHARED_CONFIG, ack_ranges=RANGES)


@st.composite
def _subscribe(draw: st.DrawFn) -> list[pb.SubscribeRequest]:
    first = pb.SubscribeRequest(credits=draw(I32))
    if draw(st.integers(0, 4)):
        first.open.CopyFrom(pb.SubscribeRequest.Open(
            stream=draw(NAMES), group=draw(GROUPS), member_id=draw(st.text(max_size=20)),
            config=draw(SHARED_CONFIG)))
    rest = draw(st.lists(st.builds(
        pb.SubscribeRequest, credits=I32, ack_offsets=OFFSETS, nack_offsets=OFFSETS,
        nack_delay_ms=I64, ack_ranges=RANGES, nack_ranges=RANGES), max_size=3))
    return [first, *rest]


# Request strategies per RPC: (kind, strategy of a message or a list of messages).
UNARY, SERVER_STREAM, BIDI = "unary", "server-stream", "bidi"
REQUESTS: dict[str, tuple[str, st.SearchStrategy]] = {
    "StreamService/CreateStream": (UNARY, st.builds(
        pb.CreateStreamRequest, name=NAMES, config=STREAM_CONFIG, exist_ok=st.booleans(),
        value_schema=SCHEMAS)),
    "StreamService/DescribeStream": (UNARY, st.builds(pb.DescribeStreamRequest, name=NAMES)),
    "StreamService/ListStreams": (UNARY, st.builds(
        pb.ListStreamsRequest, prefix=st.one_of(NAMES, st.just("")), pattern=PATTERNS,
        page_size=I32, page_token=st.one_of(st.text(max_size=20), st.just("fz-")))),
    "StreamService/UpdateStream": (UNARY, st.builds(
        pb.UpdateStreamRequest, name=NAMES, config=STREAM_CONFIG, value_schema=SCHEMAS)),
    "StreamService/DeleteStream": (UNARY, st.builds(
        pb.DeleteStreamRequest, name=st.one_of(st.sampled_from(["fz-new-1", "fz-new-2"]),
                                               st.sampled_from(BOUNDARY_NAMES)))),
    "StreamService/DeleteMessages": (UNARY, st.builds(
        pb.DeleteMessagesRequest, name=NAMES,
        before_offset=st.one_of(st.none(), I64, st.integers(0, 40)))),
    "StreamService/RepairStream": (UNARY, st.builds(pb.RepairStreamRequest, name=NAMES)),
    "StreamService/Publish": (UNARY, PUBLISH),
    "StreamService/Fetch": (UNARY, FETCH),
    "StreamService/OffsetForTimestamp": (UNARY, st.builds(
        pb.OffsetForTimestampRequest, stream=NAMES, timestamp_ms=I64)),
    "StreamService/EndOffsets": (UNARY, st.builds(
        pb.EndOffsetsRequest, streams=st.lists(NAMES, max_size=3), pattern=PATTERNS)),
    "StreamService/PublishStream": (BIDI, st.lists(PUBLISH, min_size=0, max_size=3)),
    "StreamService/PublishMany": (UNARY, st.builds(
        pb.PublishManyRequest, entries=st.lists(PUBLISH, min_size=0, max_size=3))),
    "StreamService/StreamStats": (UNARY, st.builds(
        pb.StreamStatsRequest, streams=st.lists(NAMES, max_size=3), pattern=PATTERNS)),
    "StreamReadService/Locate": (UNARY, FETCH),
    "StreamReadService/ReadRange": (SERVER_STREAM, FETCH),
    "GroupService/OpenConsumer": (UNARY, st.builds(
        pb.OpenConsumerRequest, stream=NAMES, group=GROUPS, start_from=START_FROM)),
    "GroupService/Pull": (UNARY, st.builds(
        pb.PullRequest, stream=NAMES, group=GROUPS, limit=I32, wait_ms=WAIT,
        auto_commit=st.booleans())),
    "GroupService/Commit": (UNARY, st.one_of(
        st.builds(pb.CommitRequest, stream=NAMES, group=GROUPS, offset=I64),
        st.builds(pb.CommitRequest, stream=NAMES, group=GROUPS, next_offset=I64),
        st.builds(pb.CommitRequest, stream=NAMES, group=GROUPS))),
    "GroupService/Seek": (UNARY, st.builds(
        pb.SeekRequest, stream=NAMES, group=GROUPS, to=START_FROM)),
    "GroupService/ListGroups": (UNARY, st.builds(pb.ListGroupsRequest, stream=NAMES)),
    "GroupService/DescribeGroup": (UNARY, st.builds(
        pb.DescribeGroupRequest, stream=NAMES, group=GROUPS)),
    "GroupService/DeleteGroup": (UNARY, st.builds(
        pb.DeleteGroupRequest, stream=NAMES, group=st.one_of(st.just("g2"), GROUPS))),
    "GroupService/Receive": (UNARY, RECEIVE),
    "GroupService/ReceiveBatch": (UNARY, RECEIVE),
    "GroupService/Ack": (UNARY, st.builds(
        pb.AckRequest, stream=NAMES, group=GROUPS, offsets=OFFSETS,
        member_id=st.text(max_size=10), ranges=RANGES)),
    "GroupService/Nack": (UNARY, st.builds(
        pb.NackRequest, stream=NAMES, group=GROUPS, offsets=OFFSETS, delay_ms=I64,
        member_id=st.text(max_size=10), ranges=RANGES)),
    "GroupService/Subscribe": (BIDI, _subscribe()),
    "GroupService/SubscribeBatches": (BIDI, _subscribe()),
    "SinkService/Stage": (UNARY, st.builds(
        pb.StageRequest, sink_id=st.one_of(st.just(SINK), NAMES), batch_id=I64,
        staging_id=STAGING_IDS, stream=NAMES, arrow_stream=ARROW,
        inbox_file=st.one_of(st.just(""), st.sampled_from(BOUNDARY_NAMES),
                             st.sampled_from(["../meta.sqlite3", "/etc/passwd", "x"])),
        inbox_inode=U64, inbox_length=U64)),
    "SinkService/CommitBatch": (UNARY, st.builds(
        pb.CommitBatchRequest, sink_id=st.one_of(st.just(SINK), NAMES), batch_id=I64,
        staging_ids=st.lists(STAGING_IDS, max_size=3))),
    "SinkService/AbortBatch": (UNARY, st.builds(
        pb.AbortBatchRequest, sink_id=st.one_of(st.just(SINK), NAMES), batch_id=I64,
        staging_ids=st.lists(STAGING_IDS, max_size=3))),
    "SinkService/SinkState": (UNARY, st.builds(
        pb.SinkStateRequest, sink_id=st.one_of(st.just(SINK), NAMES))),
    "SinkService/StageInbox": (UNARY, st.builds(pb.StageInboxRequest)),
    "ClusterService/Owners": (UNARY, st.builds(
        pb.OwnersRequest, streams=st.lists(NAMES, max_size=3))),
    # A broker of its own: no cluster, so every move is refused (INVALID_ARGUMENT).
    "ClusterService/MoveStream": (UNARY, st.builds(
        pb.MoveStreamRequest, stream=NAMES, to=st.text(max_size=30))),
    "ClusterService/MoveIn": (UNARY, st.builds(
        pb.MoveInRequest, stream=NAMES, move_id=st.text(max_size=40),
        source=st.text(max_size=30), step=st.integers(-1, 6),
        file=st.one_of(st.sampled_from(BOUNDARY_NAMES), st.just("../x")),
        position=I64, data=st.binary(max_size=64), state_json=st.binary(max_size=64))),
}


def test_every_rpc_is_fuzzed() -> None:
    """A new RPC in the proto must get a request strategy here."""
    methods = {f"{service.name}/{method.name}"
               for service in pb.DESCRIPTOR.services_by_name.values()
               for method in service.methods}
    assert methods == set(REQUESTS)


# ---------------------------------------------------------------- wire mutations

def _mutate(draw: Callable[..., Any], data: bytes) -> bytes:
    """The request's bytes, mostly as they are; else truncated, corrupted or replaced."""
    how = draw(st.sampled_from(["same"] * 5 + ["truncate", "flip", "garbage", "append"]))
    if how == "truncate" and data:
        return data[: draw(st.integers(0, len(data) - 1))]
    if how == "flip" and data:
        return _flip(data, draw(st.integers(0, len(data) - 1)), draw(st.integers(1, 255)))
    if how == "garbage":
        return draw(st.binary(max_size=100))
    if how == "append":
        return data + draw(st.binary(min_size=1, max_size=20))
    return data


METADATA = st.lists(st.one_of(
    st.tuples(st.just("authorization"), st.sampled_from(["", "Bearer", "Bearer x", "Basic ??"])),
    st.tuples(st.just("x-npstream-member-id"),
              st.one_of(st.from_regex(r"[ -~]{0,30}", fullmatch=True), st.just("m" * 7000))),
    st.tuples(st.just("x-junk"), st.sampled_from(["v" * 9000, "v" * 20_000, "v"])),
    st.tuples(st.just("x-junk-bin"), st.binary(max_size=64)),
), max_size=2)


def _call(channel: grpc.Channel, rpc: str, kind: str, payload: bytes | list[bytes],
          metadata: list[tuple[str, str | bytes]]) -> grpc.StatusCode:
    path = f"/npstream.v1.{rpc}"
    try:
        if kind == UNARY:
            assert isinstance(payload, bytes)
            channel.unary_unary(path)(payload, timeout=CALL_TIMEOUT_S, metadata=metadata)
        elif kind == SERVER_STREAM:
            assert isinstance(payload, bytes)
            for _ in channel.unary_stream(path)(payload, timeout=CALL_TIMEOUT_S,
                                                metadata=metadata):
                pass
        else:
            assert isinstance(payload, list)
            for _ in channel.stream_stream(path)(iter(payload), timeout=STREAM_TIMEOUT_S,
                                                 metadata=metadata):
                pass
    except grpc.RpcError as exc:
        code = exc.code()
        allowed = ALLOWED if kind == UNARY else STREAMING_ALLOWED
        assert code in allowed, f"{rpc} answered {code}: {exc.details()}"
        return code
    return grpc.StatusCode.OK


# ---------------------------------------------------------------- the broker

@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # Long polls are capped short so that random wait times do not slow the fuzzing.
    proc = BrokerProcess(tmp_path_factory.mktemp("fuzz") / "data",
                         env={"NPSTREAM_MAX_FETCH_WAIT": "100ms"}).start()
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def channel(fuzz_broker: BrokerProcess) -> Iterator[grpc.Channel]:
    with _channel(fuzz_broker) as chan:
        yield chan


def _channel(broker: BrokerProcess) -> grpc.Channel:
    return grpc.insecure_channel(broker.address, options=[
        ("grpc.max_send_message_length", 64 << 20),
        ("grpc.max_receive_message_length", 64 << 20)])


def _seed(client: Client) -> None:
    """Streams and groups the fuzzed requests name, with data, so calls get past lookups."""
    client.create_stream(UNTYPED, exist_ok=True)
    client.create_stream(TYPED, schema=TYPED_SCHEMA, exist_ok=True)
    if client.stream_info(UNTYPED).message_count < 20:
        client.publish_batch(UNTYPED, [{"value": f"m{i}", "id": f"seed-{i}"} for i in range(20)])
        client.publish_batch(TYPED, [{"value": {"a": i, "b": str(i)}} for i in range(20)])
    client.consumer(UNTYPED, GROUP).pull(1)
    client.receive(UNTYPED, "g2", 1)


def _alive(broker: BrokerProcess) -> None:
    assert broker.proc is not None and broker.proc.poll() is None, (
        f"the broker died:\n{broker.log_text()[-4000:]}")


def _healthy_and_whole(broker: BrokerProcess, token: str | None = None) -> None:
    _alive(broker)
    with Client(broker.address, token, retry_deadline=5) as client:
        client.list_streams()
        check_streams(client)


Metadata = list[tuple[str, str | bytes]]


def _fuzz(rpc: str, broker: BrokerProcess, channel: grpc.Channel, *,
          metadata: st.SearchStrategy[Metadata] = METADATA, token: str | None = None,
          check: Callable[[Metadata, grpc.StatusCode], None] | None = None) -> None:
    """Fuzz one RPC of ``broker``: hostile requests and ``metadata``, each call's code checked.

    ``token`` (all rights) seeds the streams and reads them back after the
    examples; ``check(metadata, code)`` adds what a variant requires of a code.
    """
    kind, requests = REQUESTS[rpc]
    with Client(broker.address, token, retry_deadline=5) as client:
        _seed(client)

    @FUZZ_SETTINGS
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        request = data.draw(requests, label="request")
        drawn = data.draw(metadata, label="metadata")
        if isinstance(request, list):
            payload: bytes | list[bytes] = [_mutate(data.draw, m.SerializeToString())
                                            for m in request]
        else:
            payload = _mutate(data.draw, request.SerializeToString())
        code = _call(channel, rpc, kind, payload, drawn)
        if check is not None:
            check(drawn, code)
        _alive(broker)

    run()
    _healthy_and_whole(broker, token)


@pytest.mark.parametrize("rpc", sorted(REQUESTS))
def test_fuzz_rpc(rpc: str, fuzz_broker: BrokerProcess, channel: grpc.Channel) -> None:
    _fuzz(rpc, fuzz_broker, channel)


def test_streams_are_whole_on_disk_and_after_a_restart(fuzz_broker: BrokerProcess) -> None:
    """Last: the files of every stream walk cleanly, and a restarted broker reads them all."""
    with Client(fuzz_broker.address) as client:
        before = check_streams(client)
    assert fuzz_broker.stop() == 0, fuzz_broker.log_text()[-4000:]
    on_disk = check_files(fuzz_broker.data_dir)
    assert set(on_disk) <= set(before)
    fuzz_broker.start()
    with Client(fuzz_broker.address) as client:
        assert check_streams(client) == before
    assert "unexpected error" not in fuzz_broker.log_text(), (
        "the broker logged a bug:\n" + fuzz_broker.log_text()[-6000:])


# ---------------------------------------------------------------- with a tokens file

# Tokens limited to some globs: the fuzzed names hit streams inside and outside them.
OPS, READER, WRITER = "tok-ops-1f2e", "tok-reader-3d4c", "tok-writer-5b6a"
NEW_ADMIN = "tok-new-7980"
UNKNOWN = "tok-unknown-a1b2"
TOKENS_FILE = f"""
[[tokens]]
name = "ops"
token = "{OPS}"
read = ["*"]
write = ["*"]
admin = ["*"]

[[tokens]]
name = "reader"
token = "{READER}"
read = ["{UNTYPED}", "{UNTYPED}.*"]

[[tokens]]
name = "writer"
token = "{WRITER}"
read = ["{TYPED}"]
write = ["{TYPED}", "fz-new-*"]

[[tokens]]
name = "new-admin"
token = "{NEW_ADMIN}"
admin = ["fz-new-*"]
read = ["fz-new-*"]
"""
KNOWN_TOKENS = (OPS, READER, WRITER, NEW_ADMIN)
AUTHORIZATION = st.one_of(
    st.sampled_from(KNOWN_TOKENS).map(lambda t: [("authorization", f"Bearer {t}")]),
    st.sampled_from([[], [("authorization", f"Bearer {UNKNOWN}")],
                     [("authorization", OPS)],  # no "Bearer": not a known token
                     [("authorization", f"Bearer {OPS}x")], [("authorization", "Bearer ")]]))
# The hostile metadata of the open broker without its authorization entries, after one
# of the above.
AUTH_METADATA = st.tuples(AUTHORIZATION, METADATA).map(
    lambda t: [*t[0], *(m for m in t[1] if m[0] != "authorization")])


def _token_codes(metadata: Metadata, code: grpc.StatusCode) -> None:
    known = any(key == "authorization" and value in {f"Bearer {t}" for t in KNOWN_TOKENS}
                for key, value in metadata)
    if known:
        assert code != grpc.StatusCode.UNAUTHENTICATED, metadata[:1]
    else:
        assert code in {grpc.StatusCode.UNAUTHENTICATED,
                        grpc.StatusCode.RESOURCE_EXHAUSTED}, (code, metadata[:1])


@pytest.fixture(scope="module")
def tokens_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    folder = tmp_path_factory.mktemp("fuzz-tokens")
    tokens = folder / "tokens.toml"
    tokens.write_text(TOKENS_FILE)
    proc = BrokerProcess(folder / "data", env={"NPSTREAM_MAX_FETCH_WAIT": "100ms"},
                         args=["--tokens-file", str(tokens)]).start()
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def tokens_channel(tokens_broker: BrokerProcess) -> Iterator[grpc.Channel]:
    with _channel(tokens_broker) as chan:
        yield chan


@pytest.mark.parametrize("rpc", sorted(REQUESTS))
def test_fuzz_rpc_with_tokens(rpc: str, tokens_broker: BrokerProcess,
                              tokens_channel: grpc.Channel) -> None:
    _fuzz(rpc, tokens_broker, tokens_channel, metadata=AUTH_METADATA, token=OPS,
          check=_token_codes)


def test_streams_are_whole_with_tokens_and_no_token_was_logged(
        tokens_broker: BrokerProcess) -> None:
    """Last of the tokens variant: streams whole on disk and after a restart; no secret logged."""
    with Client(tokens_broker.address, OPS) as client:
        before = check_streams(client)
    assert tokens_broker.stop() == 0, tokens_broker.log_text()[-4000:]
    assert set(check_files(tokens_broker.data_dir)) <= set(before)
    tokens_broker.start()
    with Client(tokens_broker.address, OPS) as client:
        assert check_streams(client) == before
    text = tokens_broker.log_text()
    assert "unexpected error" not in text, "the broker logged a bug:\n" + text[-6000:]
    assert not [t for t in (*KNOWN_TOKENS, UNKNOWN) if t in text]


# ---------------------------------------------------------------- what the fuzzing found

def test_a_truncated_protobuf_is_invalid_argument(channel: grpc.Channel) -> None:
    """gRPC's own deserializer answered INTERNAL ("Exception deserializing request!")."""
    request = pb.FetchRequest(stream=UNTYPED, offset=5).SerializeToString()
    for path in ("/npstream.v1.StreamService/Fetch", "/npstream.v1.GroupService/Ack"):
        with pytest.raises(grpc.RpcError) as caught:
            channel.unary_unary(path)(request[:1], timeout=CALL_TIMEOUT_S)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed" in caught.value.details()
        assert ("x-npstream-reason", "ERROR_REASON_INVALID_ARGUMENT") in [
            tuple(m) for m in caught.value.trailing_metadata()]
    with pytest.raises(grpc.RpcError) as caught:
        list(channel.stream_stream("/npstream.v1.GroupService/Subscribe")(
            iter([b"\xff\xff"]), timeout=CALL_TIMEOUT_S))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_zero_row_stage_is_stored_and_commits(fuzz_broker: BrokerProcess) -> None:
    """Staging an empty table failed with INTERNAL (pwritev of nothing read as no progress)."""
    with Client(fuzz_broker.address) as client:
        client.create_stream(UNTYPED, exist_ok=True)
        end = client.stream_info(UNTYPED).end_offset
        sink = client.sink(local_staging=False)
        assert sink.stage("zero-rows", 0, "empty", UNTYPED,
                          pa.table({"value": pa.array([], pa.binary())})).rows == 0
        sink.stage("zero-rows", 0, "one", UNTYPED, pa.table({"value": [b"x"]}))
        assert sink.commit("zero-rows", 0, ["empty", "one"]).written == {UNTYPED: (end, end + 1)}


def test_a_subscriber_that_leaves_at_once_is_no_broker_error(fuzz_broker: BrokerProcess,
                                                              channel: grpc.Channel) -> None:
    """A Subscribe whose client was gone before its first request was logged as a bug."""
    before = fuzz_broker.log_text().count("unexpected error")

    def silent() -> Iterator[bytes]:  # sends nothing until after the call's deadline
        time.sleep(1.0)
        yield from ()

    call = channel.stream_stream("/npstream.v1.GroupService/SubscribeBatches")(
        silent(), timeout=0.3)
    with pytest.raises(grpc.RpcError) as caught:
        list(call)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    _alive(fuzz_broker)
    with Client(fuzz_broker.address) as client:
        client.list_streams()  # the broker has logged what it logs for the call by now
    assert fuzz_broker.log_text().count("unexpected error") == before


# ---------------------------------------------------------------- every integer field's range

# A valid request per RPC, naming the seeded streams and groups: the table-driven test
# below sets one integer or enum field of it at a time.
BASE_REQUESTS: dict[str, Message] = {
    "StreamService/CreateStream": pb.CreateStreamRequest(name="fz-new-1", exist_ok=True),
    "StreamService/DescribeStream": pb.DescribeStreamRequest(name=UNTYPED),
    "StreamService/ListStreams": pb.ListStreamsRequest(prefix="fz-"),
    "StreamService/UpdateStream": pb.UpdateStreamRequest(name="fz-new-1"),
    "StreamService/DeleteStream": pb.DeleteStreamRequest(name="fz-new-2"),
    "StreamService/DeleteMessages": pb.DeleteMessagesRequest(name=UNTYPED, before_offset=0),
    "StreamService/RepairStream": pb.RepairStreamRequest(name=UNTYPED),
    "StreamService/Publish": pb.PublishRequest(stream=UNTYPED,
                                               messages=[pb.Message(value=b"r")]),
    "StreamService/Fetch": pb.FetchRequest(stream=UNTYPED),
    "StreamService/OffsetForTimestamp": pb.OffsetForTimestampRequest(stream=UNTYPED),
    "StreamService/EndOffsets": pb.EndOffsetsRequest(streams=[UNTYPED]),
    "StreamService/PublishStream": pb.PublishRequest(stream=UNTYPED,
                                                     messages=[pb.Message(value=b"r")]),
    "StreamService/PublishMany": pb.PublishManyRequest(entries=[pb.PublishRequest(
        stream=UNTYPED, messages=[pb.Message(value=b"r")])]),
    "StreamService/StreamStats": pb.StreamStatsRequest(streams=[UNTYPED]),
    "StreamReadService/Locate": pb.FetchRequest(stream=UNTYPED),
    "StreamReadService/ReadRange": pb.FetchRequest(stream=UNTYPED),
    "GroupService/OpenConsumer": pb.OpenConsumerRequest(stream=UNTYPED, group=GROUP),
    "GroupService/Pull": pb.PullRequest(stream=UNTYPED, group=GROUP),
    "GroupService/Commit": pb.CommitRequest(stream=UNTYPED, group=GROUP),
    "GroupService/Seek": pb.SeekRequest(stream=UNTYPED, group=GROUP),
    "GroupService/ListGroups": pb.ListGroupsRequest(stream=UNTYPED),
    "GroupService/DescribeGroup": pb.DescribeGroupRequest(stream=UNTYPED, group=GROUP),
    "GroupService/DeleteGroup": pb.DeleteGroupRequest(stream=UNTYPED, group="fz-gone"),
    "GroupService/Receive": pb.ReceiveRequest(stream=UNTYPED, group="fz-ranges"),
    "GroupService/ReceiveBatch": pb.ReceiveRequest(stream=UNTYPED, group="fz-ranges"),
    "GroupService/Ack": pb.AckRequest(stream=UNTYPED, group="fz-ranges"),
    "GroupService/Nack": pb.NackRequest(stream=UNTYPED, group="fz-ranges"),
    "GroupService/Subscribe": pb.SubscribeRequest(),
    "GroupService/SubscribeBatches": pb.SubscribeRequest(),
    "SinkService/Stage": pb.StageRequest(sink_id=SINK, staging_id="s-r", stream=UNTYPED,
                                         arrow_stream=_ipc(pa.table({"value": [b"r"]}))),
    "SinkService/CommitBatch": pb.CommitBatchRequest(sink_id=SINK, staging_ids=["s-none"]),
    "SinkService/AbortBatch": pb.AbortBatchRequest(sink_id=SINK),
    "SinkService/SinkState": pb.SinkStateRequest(sink_id=SINK),
    "SinkService/StageInbox": pb.StageInboxRequest(),
    "ClusterService/Owners": pb.OwnersRequest(streams=[UNTYPED]),
    "ClusterService/MoveStream": pb.MoveStreamRequest(stream=UNTYPED, to="x:1"),
    "ClusterService/MoveIn": pb.MoveInRequest(stream="fz-new-1", move_id="m"),
}
SUBSCRIBE_OPEN = pb.SubscribeRequest.Open(stream=UNTYPED, group="fz-ranges-sub")

_TYPE_BOUNDS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}


def _integer_paths(descriptor: Descriptor) -> Iterator[tuple[FieldDescriptor, ...]]:
    """Every integer or enum field reachable from a request type, as a path of fields."""
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if not field.message_type.GetOptions().map_entry:
                for rest in _integer_paths(field.message_type):
                    yield (field, *rest)
        elif field.type in _TYPE_BOUNDS:
            yield (field,)


def _with_value(base: Message, path: tuple[FieldDescriptor, ...], value: int) -> Message:
    message = type(base)()
    message.CopyFrom(base)
    target = message
    for field in path[:-1]:
        if field.is_repeated:  # the base's first element (a PublishMany's entry), or a new one
            elements = getattr(target, field.name)
            target = elements[0] if len(elements) else elements.add()
        else:
            target = getattr(target, field.name)
    last = path[-1]
    if last.is_repeated:
        getattr(target, last.name).append(value)
    else:
        setattr(target, last.name, value)
    return message


def _range_cases() -> Iterator[tuple[str, tuple[FieldDescriptor, ...], int, bool]]:
    """(rpc, field path, value, whether the value is accepted) over every field of every RPC:
    0, -1, the type's max and min, the rule's bounds and one past each, unknown enum values."""
    for rpc in sorted(REQUESTS):
        for path in _integer_paths(BASE_REQUESTS[rpc].DESCRIPTOR):
            field = path[-1]
            low, high = _TYPE_BOUNDS[field.type]
            values = {0, -1, low, high}
            if field.type == FieldDescriptor.TYPE_ENUM:
                accepted = {v.number for v in field.enum_type.values}
                values |= {99, -5} | accepted
            else:
                rule = field_ranges.RANGES[f"{field.containing_type.name}.{field.name}"]
                values |= {rule.low, rule.high, rule.low - 1, rule.high + 1}
                accepted = None
            for value in sorted(v for v in values if low <= v <= high):
                ok = (value in accepted if accepted is not None
                      else rule.low <= value <= rule.high)
                yield rpc, path, value, ok


def test_every_integer_field_of_a_request_has_a_range() -> None:
    """A new integer field in the proto must get its rule in npstream.proto.field_ranges."""
    fields = {f"{message.name}.{field.name}" for message, field in field_ranges.integer_fields()
              if field.type != FieldDescriptor.TYPE_ENUM}
    assert fields == set(field_ranges.RANGES)
    assert set(BASE_REQUESTS) == set(REQUESTS)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _send_case(channel: grpc.Channel, rpc: str, path: tuple[FieldDescriptor, ...],
               value: int) -> tuple[grpc.StatusCode, str]:
    kind = REQUESTS[rpc][0]
    request = _with_value(BASE_REQUESTS[rpc], path, value)
    target = f"/npstream.v1.{rpc}"
    try:
        if kind == UNARY:
            reply = channel.unary_unary(target)(request.SerializeToString(),
                                                timeout=CALL_TIMEOUT_S)
            if isinstance(request, pb.PublishManyRequest):  # an entry fails on its own
                result = pb.PublishManyResponse.FromString(reply).results[0]
                if result.HasField("error"):
                    return _CODES[result.error.code], result.error.message
        elif kind == SERVER_STREAM:
            list(channel.unary_stream(target)(request.SerializeToString(),
                                              timeout=CALL_TIMEOUT_S))
        else:
            if isinstance(request, pb.SubscribeRequest):
                opening = pb.SubscribeRequest(credits=1)
                opening.open.MergeFrom(SUBSCRIBE_OPEN)
                if path[0].name == "open":
                    opening.open.MergeFrom(request.open)
                    requests = [opening]
                else:
                    requests = [opening, request]
            else:
                requests = [request]
            list(channel.stream_stream(target)(iter([r.SerializeToString() for r in requests]),
                                               timeout=1.0))
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def test_every_integer_field_out_of_range_is_invalid_argument_naming_it(
        fuzz_broker: BrokerProcess, channel: grpc.Channel) -> None:
    """Every integer and enum field of every RPC at 0, -1, max, min, its rule's bounds and
    unknown enum values (issue 34: ack_wait_ms=2**63-1 was INTERNAL, ack=99 was stored).

    Out of range: INVALID_ARGUMENT naming the field and the accepted range. In range:
    whatever the call's meaning gives (OK, NOT_FOUND, OUT_OF_RANGE...), never INTERNAL.
    """
    with Client(fuzz_broker.address) as client:
        _seed(client)
        client.create_stream("fz-new-1", exist_ok=True)
    cases = list(_range_cases())
    assert len(cases) > 300
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda c: _send_case(channel, c[0], c[1], c[2]), cases))
    wrong = []
    for (rpc, path, value, ok), (code, details) in zip(cases, outcomes, strict=True):
        name = ".".join(f.name for f in path)
        if ok:
            allowed = ALLOWED if REQUESTS[rpc][0] == UNARY else STREAMING_ALLOWED
            if code not in allowed:
                wrong.append(f"{rpc} {name}={value}: {code.name} {details}")
        elif (code != grpc.StatusCode.INVALID_ARGUMENT
              or f".{path[-1].name}={value} " not in details or "accepted" not in details):
            wrong.append(f"{rpc} {name}={value} (out of range): {code.name} {details}")
    assert not wrong, "\n".join(wrong)
    _healthy_and_whole(fuzz_broker)

"""PublishMany (broker/streams/publish_many.py) and Client.publish_many, on real brokers.

Many streams' first publishes in one request are created in the nursery,
durable before the reply (kill -9 right after it loses none); each entry
fails alone (bad name, too large, no write right) with the exception
``publish`` would raise; the request's bounds are refused whole, naming them.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from harness import write_tokens_file
from npstream import (
    Client,
    InvalidArgument,
    MessageTooLarge,
    PermissionDenied,
    StreamNotFound,
)
from npstream.broker.storage.files import stream_dir
from npstream.proto import pb, pb_grpc
from npstream.proto.defaults import MAX_PUBLISH_MANY_ENTRIES
from npstream.proto.frames.payload import decode_payload
from npstream.proto.schema import MESSAGE_SCHEMA

# As in test_nursery.py: an LRU of 2 open logs, filled first, so first publishes use
# the nursery (the test modules are not importable from each other).
SMALL_LRU = {"NPSTREAM_MAX_OPEN_LOGS": "2"}


def fill_lru(address: str) -> None:
    with Client(address) as client:
        for name in ("warm-0", "warm-1"):
            client.publish_batch(name, [{"value": b"a"}, {"value": b"b"}])


def nursery_names(data_dir: Path) -> set[str]:
    with sqlite3.connect(data_dir / "meta.sqlite3") as db:
        return {row[0] for row in db.execute("SELECT stream FROM nursery")}


def fetch(stub: pb_grpc.StreamServiceStub, stream: str) -> list[tuple[int, bytes]]:
    reply = stub.Fetch(pb.FetchRequest(stream=stream, offset=0), timeout=30)
    table = pa.Table.from_batches([decode_payload(b, MESSAGE_SCHEMA) for b in reply.batches])
    return list(zip(table.column("offset").to_pylist(), table.column("value").to_pylist(),
                    strict=True))


def test_many_new_streams_in_one_call_are_durable_before_the_reply(broker_factory):
    broker = broker_factory(env=SMALL_LRU)
    fill_lru(broker.address)
    names = [f"chat-{i:04d}" for i in range(2500)]  # 3 requests of <= 1,000 entries
    with Client(broker.address) as client:
        results = client.publish_many([(n, f"hello {n}") for n in names])
        assert [r.stream for r in results] == names
        assert all(r.ok and r.offset == 0 and r.offsets == [0] for r in results)
        again = client.publish_many([(n, "second") for n in names[:3]])  # existing streams
        assert [r.offset for r in again] == [1, 1, 1]
    assert nursery_names(broker.data_dir) >= set(names[3:])
    assert not any(stream_dir(broker.data_dir, n).is_dir() for n in names[3:10])
    broker.kill()  # SIGKILL right after the replies
    broker.start()
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        ends = stub.EndOffsets(pb.EndOffsetsRequest(pattern="chat-*"), timeout=30)
        assert sorted((s.stream, s.start_offset, s.end_offset) for s in ends.streams) == [
            (n, 0, 2 if n in names[:3] else 1) for n in names]
        for name in names[:3] + names[-5:]:
            rows = fetch(stub, name)
            assert rows[0] == (0, f"hello {name}".encode())
            assert [v for _, v in rows[1:]] == ([b"second"] if name in names[:3] else [])


def test_bad_entries_fail_alone(broker_factory):
    broker = broker_factory()
    with Client(broker.address) as client:
        client.create_stream("tiny", max_message_bytes=64)
        client.publish("kept", "first")
        results = client.publish_many([
            ("good-1", {"n": 1}),
            ("bad/name", "x"),
            ("tiny", "y" * 500),
            {"stream": "kept", "value": "v", "id": "evt-1", "key": "k", "headers": {"h": "1"}},
            {"stream": "kept", "value": "v", "id": "evt-1"},  # a duplicate of the entry above
            {"stream": "good-2", "messages": [{"value": "a"}, {"value": "b", "id": "i2"}, "c"]},
            ("kept", object()),  # cannot be sent: an error of its own, nothing raised
            {"stream": "kept", "vale": "typo"},
            42,
            ("good-1", {"n": 2}),
        ])
        assert [r.ok for r in results] == [True, False, False, True, True, True, False, False,
                                           False, True]
        assert isinstance(results[1].error, InvalidArgument)
        assert isinstance(results[2].error, MessageTooLarge)
        assert "max_message_bytes" in str(results[2].error)
        assert results[3].offsets == [1] and not results[3].duplicate
        assert results[4].duplicate and results[4].offset == 1
        assert results[5].offsets == [0, 1, 2] and results[5].duplicates == []
        assert all(isinstance(results[i].error, InvalidArgument) for i in (6, 7, 8))
        assert results[0].offset == 0 and results[9].offset == 1  # input order per stream
        assert client.fetch("good-2", 0).column("value").to_pylist() == [b"a", b"b", b"c"]
        assert client.stream_info("tiny").end_offset == 0
        with pytest.raises(InvalidArgument, match="ack"):
            client.publish_many([("good-1", "x")], ack="sometimes")
        assert client.publish_many([]) == []


def test_missing_stream_without_auto_create(broker_factory):
    broker = broker_factory(env={"NPSTREAM_AUTO_CREATE_STREAMS": "false"})
    with Client(broker.address) as client:
        client.create_stream("known")
        results = client.publish_many([("unknown", "a"), ("known", "b")])
        assert isinstance(results[0].error, StreamNotFound) and results[0].offset == -1
        assert results[1].offset == 0


def test_request_bounds_are_refused_whole_naming_them(broker_factory):
    broker = broker_factory()
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        entry = pb.PublishRequest(stream="s", messages=[pb.Message(value=b"x")])
        with pytest.raises(grpc.RpcError) as refused:
            stub.PublishMany(pb.PublishManyRequest(
                entries=[entry] * (MAX_PUBLISH_MANY_ENTRIES + 1)), timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "MAX_PUBLISH_MANY_ENTRIES=10000" in refused.value.details()
        big = pb.PublishRequest(stream="s", messages=[pb.Message(value=b"x" * (9 << 20))])
        with pytest.raises(grpc.RpcError) as refused:
            stub.PublishMany(pb.PublishManyRequest(entries=[big, big]), timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "MAX_PUBLISH_MANY_BYTES" in refused.value.details()
        reply = stub.PublishMany(pb.PublishManyRequest(entries=[entry, pb.PublishRequest(
            stream="s", messages=[pb.Message(value=b"y")], arrow_stream=b"zz")]), timeout=30)
        assert reply.results[0].published.stored_count == 1
        error = reply.results[1].error
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert error.metadata["x-npstream-reason"] and "both" in error.message


def test_entries_without_the_write_right_are_refused_alone(broker_factory, tmp_path):
    broker = broker_factory(args=write_tokens_file(
        tmp_path / "tokens.toml", "admin-secret", "chat-secret", "chat-*", writable="chat-*"))
    with Client(broker.address, token="chat-secret") as client:
        results = client.publish_many([("chat-1", "a"), ("audit-1", "b"), ("chat-2", "c")])
        assert [r.ok for r in results] == [True, False, True]
        assert isinstance(results[1].error, PermissionDenied)
    with Client(broker.address, token="admin-secret") as admin:
        assert sorted(s.name for s in admin.list_streams()) == ["chat-1", "chat-2"]

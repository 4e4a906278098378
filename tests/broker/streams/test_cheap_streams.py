"""Streams as cheap as keys (issue 19): evicted logs reload, first publishes are durable, listings.

Brokers run with ``max_open_logs`` = 2, so every stream but the last two used is
evicted between the steps below and has to come back from its files.
"""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from harness import first_publishes
from npstream.proto import pb, pb_grpc
from npstream.proto.frames.payload import decode_payload
from npstream.proto.schema import MESSAGE_SCHEMA

SMALL_LRU = {"NPSTREAM_MAX_OPEN_LOGS": "2"}


def values_of(batches: list[bytes]) -> list[bytes]:
    if not batches:
        return []
    table = pa.Table.from_batches([decode_payload(b, MESSAGE_SCHEMA) for b in batches])
    return table.column("value").to_pylist()


def publish(stub: pb_grpc.StreamServiceStub, stream: str, *values: bytes) -> int:
    reply = stub.Publish(pb.PublishRequest(
        stream=stream, messages=[pb.Message(value=v) for v in values]), timeout=30)
    assert reply.stored_count == len(values)
    return int(reply.first_offset)


def fetch_all(stub: pb_grpc.StreamServiceStub, stream: str) -> list[bytes]:
    reply = stub.Fetch(pb.FetchRequest(stream=stream, offset=0), timeout=30)
    return values_of(list(reply.batches))


def test_evicted_streams_reload_on_publish_read_and_groups(broker_factory):
    broker = broker_factory(env=SMALL_LRU)
    names = [f"chat-{i}" for i in range(8)]
    with grpc.insecure_channel(broker.address) as channel:
        streams = pb_grpc.StreamServiceStub(channel)
        groups = pb_grpc.GroupServiceStub(channel)
        for name in names:  # created by first publish; each evicts an older one
            assert publish(streams, name, f"{name}/0".encode(), f"{name}/1".encode()) == 0
        for name in names:  # reads reopen them
            assert fetch_all(streams, name) == [f"{name}/0".encode(), f"{name}/1".encode()]
        for name in names:
            groups.OpenConsumer(pb.OpenConsumerRequest(stream=name, group="g"), timeout=30)
        for name in names:  # cursor groups: pull one, commit, evict, pull the next
            pulled = groups.Pull(pb.PullRequest(stream=name, group="g", limit=1,
                                                auto_commit=True), timeout=30)
            assert values_of(list(pulled.batches)) == [f"{name}/0".encode()]
        for name in names:  # appends continue the offsets of the reopened logs
            assert publish(streams, name, f"{name}/2".encode()) == 2
        for name in names:
            pulled = groups.Pull(pb.PullRequest(stream=name, group="g", limit=10,
                                                auto_commit=True), timeout=30)
            assert values_of(list(pulled.batches)) == [f"{name}/1".encode(),
                                                       f"{name}/2".encode()]
            assert pulled.next_offset == 3
        for name in names:  # shared groups: receive, evict (others used), ack
            got = groups.Receive(pb.ReceiveRequest(stream=name, group="s", member_id="m",
                                                   max_messages=10), timeout=30)
            assert [d.offset for d in got.deliveries] == [0, 1, 2]
        for name in names:
            acked = groups.Ack(pb.AckRequest(stream=name, group="s", member_id="m",
                                             offsets=[0, 1, 2]), timeout=30)
            assert acked.position.committed_offset == 3
        ends = streams.EndOffsets(pb.EndOffsetsRequest(pattern="chat-*"), timeout=30)
        assert sorted((s.stream, s.start_offset, s.end_offset) for s in ends.streams) == [
            (n, 0, 3) for n in sorted(names)]
    broker.restart(hard=True)  # evicted logs were never closed: recovery from the files
    with grpc.insecure_channel(broker.address) as channel:
        streams = pb_grpc.StreamServiceStub(channel)
        groups = pb_grpc.GroupServiceStub(channel)
        for name in names:
            assert fetch_all(streams, name) == [f"{name}/{i}".encode() for i in range(3)]
            info = groups.DescribeGroup(pb.DescribeGroupRequest(stream=name, group="g"))
            assert info.committed_offset == 3


def test_streams_created_by_first_publish_survive_kill_9_right_after_the_ack(broker_factory):
    broker = broker_factory(env=SMALL_LRU)
    names = [f"sensor-{i:04d}" for i in range(300)]
    # Concurrent calls: creates share group inserts and filesystem syncs.
    acked = first_publishes(broker.address, names, 6)
    broker.kill()  # SIGKILL at once: nothing flushed or closed after the acks
    assert sorted(acked) == names
    broker.start()
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        ends = stub.EndOffsets(pb.EndOffsetsRequest(pattern="sensor-*"), timeout=60)
        assert sorted((s.stream, s.start_offset, s.end_offset) for s in ends.streams) == [
            (n, 0, 1) for n in names]
        for name in names[::37]:
            assert fetch_all(stub, name) == [name.encode()]


LISTED = sorted([f"room-{i:03d}" for i in range(120)]
                + [f"room-{i:03d}x" for i in range(0, 120, 10)]
                + ["roo", "rooms", "room", "s-1", "t-2", "room-a", "room-b1"])


def list_all(stub: pb_grpc.StreamServiceStub, page_size: int, **request: str) -> list[str]:
    names: list[str] = []
    token = ""
    pages = 0
    while True:
        page = stub.ListStreams(pb.ListStreamsRequest(page_size=page_size, page_token=token,
                                                      **request), timeout=30)
        assert len(page.streams) <= page_size
        names += [s.name for s in page.streams]
        pages += 1
        token = page.next_page_token
        if not token:
            assert pages == max(1, -(-len(names) // page_size))  # no empty last page
            return names


@pytest.mark.parametrize("query", [
    {}, {"prefix": "room-"}, {"prefix": "room-00"}, {"prefix": "zz"},
    {"pattern": "room-*"}, {"pattern": "room-0?0"}, {"pattern": "*x"}, {"pattern": "room-[ab]*"},
    {"pattern": "room-[!0-9]*"}, {"pattern": "*"}, {"pattern": "roo?"},
    {"prefix": "room-01", "pattern": "*5"}, {"prefix": "room-", "pattern": "t*"},
    {"prefix": "room-0", "pattern": "room-*"},
])
def test_listing_pages_prefixes_and_globs(broker, query):
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        for name in LISTED:
            stub.CreateStream(pb.CreateStreamRequest(name=name), timeout=30)
        expected = [n for n in LISTED if n.startswith(query.get("prefix", ""))
                    and fnmatch.fnmatchcase(n, query.get("pattern", "*"))]
        listed = [n for n in list_all(stub, 7, **query) if n in set(LISTED)]
        assert listed == expected
        assert [n for n in list_all(stub, 1000, **query) if n in set(LISTED)] == expected


def test_listing_reports_the_stats_of_streams_not_open(broker_factory):
    """Listed streams are described from their files (storage/peek.py) exactly as opened."""
    broker = broker_factory(env=SMALL_LRU)
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        for i in range(6):
            for j in range(i + 1):
                publish(stub, f"peek-{i}", *[b"v" * (j + 1)] * (j + 1))
        stub.CreateStream(pb.CreateStreamRequest(name="peek-empty"), timeout=30)
        stub.DeleteMessages(pb.DeleteMessagesRequest(name="peek-5", before_offset=4))
        stub.DeleteMessages(pb.DeleteMessagesRequest(name="peek-4"))
        listed = {s.name: s for s in stub.ListStreams(
            pb.ListStreamsRequest(prefix="peek-"), timeout=30).streams}
        for name, info in listed.items():  # each one opened: what its log says
            if info.end_offset > info.start_offset:
                stub.Fetch(pb.FetchRequest(stream=name, offset=info.start_offset), timeout=30)
            described = stub.DescribeStream(pb.DescribeStreamRequest(name=name), timeout=30)
            assert info == described, name
        assert (listed["peek-5"].start_offset, listed["peek-5"].end_offset) == (4, 21)
        assert (listed["peek-4"].start_offset, listed["peek-4"].end_offset) == (15, 15)
        assert listed["peek-empty"].end_offset == 0


@pytest.mark.slow
def test_many_streams_bench_small_run():
    """bench/many_streams.py's phases at a small size: every correctness row holds."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    import many_streams

    figures = many_streams.run(1500, calls=4, reload=200, skip_floor=True, progress=False)
    verdicts = {row[0]: row[3] for row in figures["rows"]}
    assert figures["after_restart_ok"] is True
    assert any(label.startswith("evicted streams reloaded") for label in verdicts)
    assert figures["create_rate"] > 0 and figures["data_dir_files"] >= 1  # nursery: few files

"""The nursery (broker/streams/nursery.py): streams created by a one-message first publish.

Once the LRU of open logs is full they are kept as SQLite rows until their
log is first opened. Real broker processes over gRPC with max_open_logs = 2,
the LRU filled first (``fill_lru``): every reader sees the same stream as
before, the acknowledged first messages survive kill -9 right after the acks,
and a stream gets its directory only when something opens its log.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import grpc
import pyarrow as pa

from harness import first_publishes
from npstream.broker.storage.files import segment_path, stream_dir
from npstream.broker.storage.first_frame import lone_first_frame, write_first_segment
from npstream.broker.storage.settings import StreamConfig
from npstream.proto import pb, pb_grpc
from npstream.proto.frames.payload import decode_payload
from npstream.proto.schema import MESSAGE_SCHEMA

SMALL_LRU = {"NPSTREAM_MAX_OPEN_LOGS": "2"}


def fill_lru(address: str) -> None:
    """Open two logs (two-message publishes take the usual path): the LRU of 2 is full."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        for name in ("warm-0", "warm-1"):
            stub.Publish(pb.PublishRequest(stream=name, messages=[
                pb.Message(value=b"a"), pb.Message(value=b"b")]), timeout=30)


def rows_of(batches: list[bytes]) -> list[tuple[int, str, bytes]]:
    if not batches:
        return []
    table = pa.Table.from_batches([decode_payload(b, MESSAGE_SCHEMA) for b in batches])
    return list(zip(table.column("offset").to_pylist(), table.column("id").to_pylist(),
                    table.column("value").to_pylist(), strict=True))


def fetch(stub: pb_grpc.StreamServiceStub, stream: str) -> list[tuple[int, str, bytes]]:
    return rows_of(list(stub.Fetch(pb.FetchRequest(stream=stream, offset=0), timeout=30).batches))


def nursery_names(data_dir: Path) -> set[str]:
    with sqlite3.connect(data_dir / "meta.sqlite3") as db:
        return {row[0] for row in db.execute("SELECT stream FROM nursery")}


def has_dir(data_dir: Path, name: str) -> bool:
    return stream_dir(data_dir, name).is_dir()


def test_first_publish_keeps_no_directory_until_the_log_is_opened(broker_factory):
    broker = broker_factory(env=SMALL_LRU)
    with grpc.insecure_channel(broker.address) as channel:  # room in the LRU: opened at once
        stub = pb_grpc.StreamServiceStub(channel)
        stub.Publish(pb.PublishRequest(stream="early", messages=[pb.Message(value=b"e")]))
    assert has_dir(broker.data_dir, "early") and not nursery_names(broker.data_dir)
    fill_lru(broker.address)
    names = [f"chat-{i:03d}" for i in range(40)]
    assert sorted(first_publishes(broker.address, names, 4)) == names
    assert nursery_names(broker.data_dir) >= set(names)
    assert not any(has_dir(broker.data_dir, n) for n in names)
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        listed = {s.name: s for s in stub.ListStreams(
            pb.ListStreamsRequest(prefix="chat-"), timeout=30).streams}
        assert sorted(listed) == names
        ends = stub.EndOffsets(pb.EndOffsetsRequest(pattern="chat-*"), timeout=30)
        assert sorted((s.stream, s.start_offset, s.end_offset) for s in ends.streams) == [
            (n, 0, 1) for n in names]
        assert not any(has_dir(broker.data_dir, n) for n in names)  # neither opened a log
        for name in names[:10]:  # a read writes the stream out; it reports what was listed
            [(offset, message_id, value)] = fetch(stub, name)
            assert (offset, value) == (0, name.encode()) and len(message_id) == 32
            assert has_dir(broker.data_dir, name) and name not in nursery_names(broker.data_dir)
            described = stub.DescribeStream(pb.DescribeStreamRequest(name=name), timeout=30)
            assert described == listed[name]
            assert listed[name].last_timestamp_ms == listed[name].first_timestamp_ms > 0
        for name in names[10:20]:  # a second publish continues at offset 1
            reply = stub.Publish(pb.PublishRequest(stream=name, messages=[
                pb.Message(value=b"second")]), timeout=30)
            assert (reply.first_offset, reply.stored_count) == (1, 1)
        ids = {fetch(stub, n)[0][1] for n in names[:20]}
        assert len(ids) == 20  # broker-filled ids stay unique across streams
    broker.restart(hard=True)
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        for name in names[10:20]:
            assert [v for _, _, v in fetch(stub, name)] == [name.encode(), b"second"]
        for name in names[20:]:
            assert [v for _, _, v in fetch(stub, name)] == [name.encode()]


def test_first_publishes_acked_then_kill_9_all_there_and_usable(broker_factory):
    broker = broker_factory(env=SMALL_LRU)
    fill_lru(broker.address)
    names = [f"sensor-{i:04d}" for i in range(400)]
    acked = first_publishes(broker.address, names, 8)
    broker.kill()  # at once after the last ack
    assert sorted(acked) == names
    broker.start()
    assert nursery_names(broker.data_dir) == set(names)
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        groups = pb_grpc.GroupServiceStub(channel)
        listed = stub.ListStreams(pb.ListStreamsRequest(prefix="sensor-", page_size=1000))
        assert [(s.name, s.start_offset, s.end_offset) for s in listed.streams] == [
            (n, 0, 1) for n in names]
        for name in names[::50]:  # a cursor group, a shared group
            groups.OpenConsumer(pb.OpenConsumerRequest(stream=name, group="g"), timeout=30)
            pulled = groups.Pull(pb.PullRequest(stream=name, group="g", limit=5,
                                                auto_commit=True), timeout=30)
            assert [v for _, _, v in rows_of(list(pulled.batches))] == [name.encode()]
        for name in names[1::50]:
            got = groups.Receive(pb.ReceiveRequest(stream=name, group="s", member_id="m",
                                                   max_messages=5), timeout=30)
            assert [d.offset for d in got.deliveries] == [0]
    broker.restart(hard=True)
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        for name in names[::7]:
            assert [(o, v) for o, _, v in fetch(stub, name)] == [(0, name.encode())]


def test_delete_update_and_a_publish_racing_the_create(broker_factory):
    broker = broker_factory(env=SMALL_LRU)
    fill_lru(broker.address)
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        assert first_publishes(broker.address, ["gone", "tuned"], 1) == ["gone", "tuned"]
        assert nursery_names(broker.data_dir) == {"gone", "tuned"}
        assert stub.DeleteStream(pb.DeleteStreamRequest(name="gone"), timeout=30).deleted
        assert "gone" not in nursery_names(broker.data_dir)
        reply = stub.Publish(pb.PublishRequest(stream="gone", messages=[
            pb.Message(value=b"new")]), timeout=30)
        assert reply.first_offset == 0
        assert [v for _, _, v in fetch(stub, "gone")] == [b"new"]  # nothing of the old one
        updated = stub.UpdateStream(pb.UpdateStreamRequest(
            name="tuned", config=pb.StreamConfig(max_age_ms=3_600_000)), timeout=30)
        assert updated.config.max_age_ms == 3_600_000
        assert (updated.start_offset, updated.end_offset) == (0, 1)
        assert "tuned" not in nursery_names(broker.data_dir)
        # The same new name from many calls at once: one stream, offsets 0..n-1.
        racing = [f"race-{k}" for k in range(5)]
        done: list[int] = []

        def publish_all() -> None:
            with grpc.insecure_channel(broker.address) as own:
                own_stub = pb_grpc.StreamServiceStub(own)
                requests = (pb.PublishRequest(stream=n, messages=[pb.Message(value=b"x")])
                            for n in racing)
                done.extend(r.first_offset for r in own_stub.PublishStream(requests))

        threads = [threading.Thread(target=publish_all) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(done) == sorted(list(range(6)) * 5)
        for name in racing:
            assert [o for o, _, _ in fetch(stub, name)] == list(range(6))


def test_expired_nursery_streams_are_written_out_and_expire(broker_factory):
    broker = broker_factory(env={**SMALL_LRU, "NPSTREAM_DEFAULT_MAX_AGE": "300ms",
                                 "NPSTREAM_RETENTION_CHECK_INTERVAL": "100ms"})
    fill_lru(broker.address)
    names = [f"old-{i}" for i in range(5)]
    assert sorted(first_publishes(broker.address, names, 2)) == names
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            infos = [stub.DescribeStream(pb.DescribeStreamRequest(name=n)) for n in names]
            if all(i.start_offset == i.end_offset == 1 for i in infos):
                break
            time.sleep(0.1)
        assert [(i.start_offset, i.end_offset) for i in infos] == [(1, 1)] * 5
        assert not nursery_names(broker.data_dir) & set(names)
        reply = stub.Publish(pb.PublishRequest(stream=names[0], messages=[
            pb.Message(value=b"later")]), timeout=30)
        assert reply.first_offset == 1  # offsets keep growing


def test_write_first_segment_is_idempotent_after_a_crash(tmp_path):
    """A crash between writing the segment out and deleting the row: written out again safely."""
    directory = tmp_path / "streams" / "s"
    config = StreamConfig()
    frame = lone_first_frame(b"hello", 1_700_000_000_000)
    write_first_segment(directory, frame, config)
    path = segment_path(directory, 0)
    assert path.read_bytes() == frame
    with open(path, "ab") as segment:  # appends made after it was written out
        segment.write(b"later frames")
    write_first_segment(directory, frame, config)  # the row came back: nothing rewritten
    assert path.read_bytes() == frame + b"later frames"
    path.write_bytes(frame[:7])  # torn by a crash mid-write: written again
    write_first_segment(directory, frame, config)
    assert path.read_bytes() == frame


def kept_stats(data_dir: Path) -> dict[str, tuple[int, int]]:
    with sqlite3.connect(data_dir / "meta.sqlite3") as db:
        return {row[0]: (row[1], row[2]) for row in db.execute(
            "SELECT stream, start_offset, end_offset FROM stream_stats")}


def listed(stub: pb_grpc.StreamServiceStub, prefix: str) -> dict[str, pb.StreamInfo]:
    return {s.name: s for s in stub.ListStreams(
        pb.ListStreamsRequest(prefix=prefix, page_size=1000), timeout=30).streams}


def described_opened(stub: pb_grpc.StreamServiceStub, name: str) -> pb.StreamInfo:
    """DescribeStream of the stream with its log opened (EndOffsets opens it)."""
    stub.EndOffsets(pb.EndOffsetsRequest(streams=[name]), timeout=30)
    return stub.DescribeStream(pb.DescribeStreamRequest(name=name), timeout=30)


def test_listings_keep_idle_streams_stats_exact_after_eviction_restart_and_kill_9(
        broker_factory):
    """Idle streams' stats kept in SQLite (streams/listing_stats.py) are what opening reports."""
    broker = broker_factory(env=SMALL_LRU)
    names = [f"idle-{i:02d}" for i in range(12)]
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        for i, name in enumerate(names):  # several messages each: written out, then evicted
            for j in range(i % 3 + 2):
                stub.Publish(pb.PublishRequest(stream=name, messages=[
                    pb.Message(value=b"v" * (j + 1))] * (j + 1)), timeout=30)
        stub.DeleteMessages(pb.DeleteMessagesRequest(name=names[5], before_offset=2))
        first = listed(stub, "idle-")  # evicted ones read from files, then kept
        kept = kept_stats(broker.data_dir)
        assert len(kept) >= len(names) - 2  # all but the two the LRU holds
        assert {n: (first[n].start_offset, first[n].end_offset) for n in kept} == kept
        assert listed(stub, "idle-") == first  # now from the kept rows
        for name in names:
            assert described_opened(stub, name) == first[name], name
        for name in names[:4]:  # opened and changed: their rows went at the open
            stub.Publish(pb.PublishRequest(stream=name, messages=[pb.Message(value=b"x")]),
                         timeout=30)
        assert not set(names[:4]) & set(kept_stats(broker.data_dir))
        second = listed(stub, "idle-")
        for name in names:
            assert described_opened(stub, name) == second[name], name
        assert [second[n].end_offset - first[n].end_offset for n in names] == (
            [1] * 4 + [0] * 8)
    broker.stop()
    broker.start()  # a clean restart: the kept rows describe the idle streams
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        assert listed(stub, "idle-") == second
        for name in names[4:8]:
            stub.Publish(pb.PublishRequest(stream=name, messages=[pb.Message(value=b"y")]),
                         timeout=30)
        for name in names[8:]:
            stub.EndOffsets(pb.EndOffsetsRequest(streams=[name]), timeout=30)
    broker.kill()  # right after the publishes: their rows went when their logs opened
    broker.start()
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        third = listed(stub, "idle-")
        for name in names:
            assert described_opened(stub, name) == third[name], name
        assert [third[n].end_offset - second[n].end_offset for n in names] == (
            [0] * 4 + [1] * 4 + [0] * 4)
        assert stub.DeleteStream(pb.DeleteStreamRequest(name=names[0]), timeout=30).deleted
        assert names[0] not in kept_stats(broker.data_dir)

"""Restarts keep what was acknowledged; a corrupt log is fenced off until repaired."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pyarrow as pa
import pytest

from npstream.proto import pb, pb_grpc
from npstream.proto.schema import MESSAGE_SCHEMA


def read_all(stub, stream: str) -> pa.Table:
    batches: list[pa.RecordBatch] = []
    offset = 0
    while True:
        reply = stub.Fetch(pb.FetchRequest(stream=stream, offset=offset), timeout=10)
        batches += [pa.ipc.read_record_batch(pa.py_buffer(b), MESSAGE_SCHEMA)
                    for b in reply.batches]
        if reply.next_offset >= reply.end_offset:
            return pa.Table.from_batches(batches, schema=MESSAGE_SCHEMA)
        offset = reply.next_offset


def publish_concurrently(address: str, stream: str, requests: int) -> dict[int, bytes]:
    """Publish one message per request from 4 threads (ack=fsync); {offset: value} acked."""
    acked: dict[int, bytes] = {}
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)

        def one(i: int) -> tuple[int, bytes]:
            value = f"msg-{i}".encode()
            reply = stub.Publish(pb.PublishRequest(
                stream=stream, messages=[pb.Message(id=f"id-{i}", value=value)],
                ack=pb.ACK_FSYNC), timeout=30)
            return reply.first_offset, value

        with ThreadPoolExecutor(4) as pool:
            acked.update(pool.map(one, range(requests)))
    return acked


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "kill9"])
def test_restart_keeps_every_acked_message_at_the_same_offset(broker_factory, hard):
    broker = broker_factory()
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        created = stub.CreateStream(pb.CreateStreamRequest(
            name="kept", config=pb.StreamConfig(max_age_ms=3_600_000)))
        stub.CreateStream(pb.CreateStreamRequest(name="empty"))
    acked = publish_concurrently(broker.address, "kept", 200)
    assert sorted(acked) == list(range(200))
    broker.restart(hard=hard)
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        table = read_all(stub, "kept")
        assert dict(zip(table.column("offset").to_pylist(), table.column("value").to_pylist(),
                        strict=True)) == acked
        info = stub.DescribeStream(pb.DescribeStreamRequest(name="kept"))
        assert (info.end_offset, info.created_ms, info.config.max_age_ms) == (
            200, created.created_ms, 3_600_000)
        assert stub.DescribeStream(pb.DescribeStreamRequest(name="empty")).end_offset == 0
        # Offsets continue, and ids seen before the restart are still deduplicated.
        reply = stub.Publish(pb.PublishRequest(stream="kept", messages=[
            pb.Message(id="id-7", value=b"again"), pb.Message(value=b"next")]))
        assert (reply.first_offset, reply.stored_count) == (200, 1)
        offset_of_7 = next(o for o, v in acked.items() if v == b"msg-7")
        assert [(d.index, d.offset) for d in reply.duplicates] == [(0, offset_of_7)]


def test_corrupt_segment_is_reported_and_refused_until_repaired(broker_factory):
    broker = broker_factory()
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        for i in range(5):  # five requests, five stored batches
            stub.Publish(pb.PublishRequest(stream="bad", messages=[
                pb.Message(value=f"value-{i}".encode() * 10)]))
        stub.Publish(pb.PublishRequest(stream="good", messages=[pb.Message(value=b"ok")]))
    broker.kill()  # no clean-shutdown marker: the tail segment is scanned on open
    segment = broker.data_dir / "streams" / "bad" / f"{0:020d}.log"
    data = bytearray(segment.read_bytes())
    data[60] ^= 0xFF  # inside the first frame's payload (48-byte header)
    segment.write_bytes(bytes(data))
    broker.start()
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        info = stub.DescribeStream(pb.DescribeStreamRequest(name="bad"))
        assert "cannot be opened: corrupt record in" in info.error
        assert "npstream streams repair bad" in info.error
        listed = stub.ListStreams(pb.ListStreamsRequest()).streams
        assert {s.name: bool(s.error) for s in listed} == {"bad": True, "good": False}
        for call, request in (
            (stub.Fetch, pb.FetchRequest(stream="bad", offset=0)),
            (stub.Publish, pb.PublishRequest(stream="bad", messages=[pb.Message(value=b"x")])),
            (stub.EndOffsets, pb.EndOffsetsRequest(streams=["bad"])),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call(request)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "stream 'bad' cannot be opened" in err.value.details()
        assert stub.Fetch(pb.FetchRequest(stream="good", offset=0)).count == 1
        repaired = stub.RepairStream(pb.RepairStreamRequest(name="bad"))
        assert repaired.truncated_bytes > 0
        assert f"{0:020d}.log" in repaired.detail
        assert repaired.stream.error == ""
        assert repaired.stream.end_offset == 0  # cut at the first (bad) frame
        reply = stub.Publish(pb.PublishRequest(stream="bad", messages=[pb.Message(value=b"x")]))
        assert reply.first_offset == 0
        assert stub.Fetch(pb.FetchRequest(stream="bad", offset=0)).count == 1

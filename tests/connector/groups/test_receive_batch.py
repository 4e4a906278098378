"""Shared groups consumed in batches: receive_batch, LeaseBatch and range acks, on a real broker."""

from __future__ import annotations

import datetime as dt
import json
import time

import grpc
import numpy as np
import pytest

from npstream import Client
from npstream.broker.groups.dead_letter import DLQ_HEADERS
from npstream.errors import InvalidArgument
from npstream.groups.batch import offset_ranges
from npstream.proto import pb, pb_grpc
from npstream.proto.schema import DELIVERY_SCHEMA


def publish(client: Client, stream: str, count: int, prefix: str = "m") -> None:
    client.create_stream(stream, exist_ok=True)
    client.publish_batch(stream, [{"value": f"{prefix}{i}", "key": f"k{i % 3}"}
                                  for i in range(count)])


def test_offset_ranges_are_sorted_runs():
    assert offset_ranges(np.array([7, 3, 4, 5, 9, 8, 1])) == [(1, 2), (3, 6), (7, 10)]
    assert offset_ranges(np.array([], dtype=np.int64)) == []
    # Already strictly increasing (no np.unique): runs as they are.
    assert offset_ranges(np.arange(5000, 6000)) == [(5000, 6000)]
    assert offset_ranges(np.array([1, 2, 5, 7, 8])) == [(1, 3), (5, 6), (7, 9)]
    assert offset_ranges(np.array([4])) == [(4, 5)]
    # Repeats or not sorted: distinct and sorted first.
    assert offset_ranges(np.array([1, 2, 2, 3])) == [(1, 4)]
    assert offset_ranges(np.array([3, 3])) == [(3, 4)]


def test_a_batch_is_one_arrow_table_with_attempt_and_lease_end(client, stream_name):
    publish(client, stream_name, 25)
    before = dt.datetime.now(dt.UTC)
    batch = client.receive_batch(stream_name, "g", max=10, ack_wait=30)
    assert batch.table.schema == DELIVERY_SCHEMA
    assert len(batch) == 10 and batch.unsettled == 10
    assert batch.table.column("offset").to_pylist() == list(range(10))
    assert batch.table.column("value").to_pylist() == [f"m{i}".encode() for i in range(10)]
    assert batch.table.column("key").to_pylist() == [f"k{i % 3}".encode() for i in range(10)]
    assert set(batch.table.column("attempt").to_pylist()) == {1}
    expires = batch.table.column("lease_expires").to_pylist()
    assert len(set(expires)) == 1
    assert dt.timedelta(seconds=29) < expires[0] - before < dt.timedelta(seconds=32)
    assert batch.ack() == 10
    assert batch.ack() == 0 and batch.unsettled == 0  # settling twice is a no-op
    info = client.describe_group(stream_name, "g")
    assert (info.committed_offset, info.in_flight) == (10, 0)


def test_partial_ack_and_nack_redeliver_only_the_nacked_first(client, stream_name):
    publish(client, stream_name, 20)
    batch = client.receive_batch(stream_name, "g", max=20)
    assert batch.ack([0, 1, 2, 10, 11]) == 5
    assert batch.nack([5, 6], delay=0) == 2
    assert batch.unsettled == 13
    again = client.receive_batch(stream_name, "g", max=3, member_id="other")
    assert again.table.column("offset").to_pylist() == [5, 6]  # redeliveries first...
    assert again.table.column("attempt").to_pylist() == [2, 2]
    assert again.ack() == 2
    assert batch.ack() == 13  # the rest of the first batch, still leased to its member
    info = client.describe_group(stream_name, "g")
    assert (info.committed_offset, info.in_flight) == (20, 0)


def test_ack_with_the_next_receive_drains_every_message_once(client, stream_name):
    publish(client, stream_name, 5000)
    seen: list[int] = []
    batch = None
    while True:
        batch = client.receive_batch(stream_name, "g", max=700, wait=0.2, ack=batch)
        if not len(batch):
            break
        seen += batch.offsets.tolist()
        assert set(batch.table.column("attempt").to_pylist()) == {1}
    assert sorted(seen) == list(range(5000))
    info = client.describe_group(stream_name, "g")
    assert (info.committed_offset, info.in_flight) == (5000, 0)


def test_ack_of_another_groups_batch_is_refused(client, stream_name):
    publish(client, stream_name, 3)
    batch = client.receive_batch(stream_name, "g1", max=3)
    with pytest.raises(InvalidArgument, match="ack= is a batch of group 'g1'"):
        client.receive_batch(stream_name, "g2", ack=batch)
    assert batch.unsettled == 3


def test_expired_batch_comes_back_with_the_next_attempt(client, stream_name):
    publish(client, stream_name, 4)
    first = client.receive_batch(stream_name, "g", max=4, ack_wait=0.2)
    time.sleep(0.4)
    again = client.receive_batch(stream_name, "g", max=10, ack_wait=30, wait=2)
    assert again.table.column("offset").to_pylist() == [0, 1, 2, 3]
    assert again.table.column("attempt").to_pylist() == [2] * 4
    assert first.ack() == 4  # a late ack is still accepted: the work was done
    assert again.ack() == 0


def test_out_of_attempts_the_range_is_dead_lettered_with_its_rows(client, stream_name):
    publish(client, stream_name, 6)
    batch = client.receive_batch(stream_name, "g", max=6, max_deliver=1)
    assert batch.nack([1, 2, 3]) == 3
    batch.ack()
    dlq = f"{stream_name}.dlq"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if client.list_streams(prefix=dlq) and client.stream_info(dlq).end_offset == 3:
            break
        time.sleep(0.05)
    copies = client.fetch(dlq, 0)
    assert copies.column("value").to_pylist() == [b"m1", b"m2", b"m3"]
    headers = [dict(h) for h in copies.column("headers").to_pylist()]
    assert [h[DLQ_HEADERS["offset"]] for h in headers] == [b"1", b"2", b"3"]
    assert {h[DLQ_HEADERS["reason"]] for h in headers} == {b"nack"}
    info = client.describe_group(stream_name, "g")
    assert (info.committed_offset, info.dead_lettered) == (6, 3)


def test_typed_stream_values_come_as_json(client, stream_name):
    client.create_stream(stream_name, schema="sensorId STRING NOT NULL, reading DOUBLE")
    client.publish(stream_name, {"sensorId": "s1", "reading": 2.5})
    batch = client.receive_batch(stream_name, "g", max=5)
    assert [json.loads(v) for v in batch.table.column("value").to_pylist()] == [
        {"sensorId": "s1", "reading": 2.5}]
    batch.ack()


def test_more_in_flight_than_the_old_10000_cap(client, stream_name):
    publish(client, stream_name, 30_000)
    held = [client.receive_batch(stream_name, "g", max=10_000) for _ in range(3)]
    assert [len(b) for b in held] == [10_000] * 3
    assert client.describe_group(stream_name, "g").in_flight == 30_000
    assert sum(b.ack() for b in held) == 30_000


def test_receive_and_receive_batch_share_a_group(client, stream_name):
    publish(client, stream_name, 10)
    leases = client.receive(stream_name, "g", max=4)
    batch = client.receive_batch(stream_name, "g", max=10)
    assert [lease.offset for lease in leases] == [0, 1, 2, 3]
    assert batch.offsets.tolist() == [4, 5, 6, 7, 8, 9]
    leases[1].nack()
    again = client.receive_batch(stream_name, "g", max=10)
    assert again.offsets.tolist() == [1]


def test_a_reversed_range_is_invalid_argument(broker, client, stream_name):
    publish(client, stream_name, 2)
    client.receive_batch(stream_name, "g", max=2)
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.GroupServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Ack(pb.AckRequest(stream=stream_name, group="g",
                                   ranges=[pb.OffsetRange(start=5, end=2)]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "range [5, 2) is not a range of offsets" in info.value.details()


def test_acks_carried_by_receive_survive_kill_9_and_the_rest_is_redelivered(broker_factory):
    broker = broker_factory("batch-restart")
    with Client(broker.address) as client:
        publish(client, "s", 100)
        first = client.receive_batch("s", "g", max=60)
        second = client.receive_batch("s", "g", max=10, ack=first)  # acks 0..59, durably
        assert second.offsets.tolist() == list(range(60, 70))
    broker.restart(hard=True)
    with Client(broker.address) as client:
        again = client.receive_batch("s", "g", max=100, wait=2)
        assert again.offsets.tolist() == list(range(60, 100))
        assert again.ack() == 40
        assert client.describe_group("s", "g").committed_offset == 100

"""receive_batches: a shared group consumed batch after batch with the next one prefetched."""

from __future__ import annotations

import time

import pytest

from npstream import Client
from npstream.errors import InvalidArgument


def publish(client: Client, stream: str, count: int) -> None:
    client.create_stream(stream, exist_ok=True)
    client.publish_batch(stream, [{"value": f"m{i}"} for i in range(count)])


def wait_for_in_flight(client: Client, stream: str, group: str, count: int) -> None:
    deadline = time.monotonic() + 10
    while client.describe_group(stream, group).in_flight != count:
        assert time.monotonic() < deadline, client.describe_group(stream, group)
        time.sleep(0.01)


def wait_for_committed(client: Client, stream: str, group: str, offset: int) -> None:
    deadline = time.monotonic() + 10
    while (info := client.describe_group(stream, group)).committed_offset != offset:
        assert time.monotonic() < deadline, info
        time.sleep(0.01)


def test_draining_takes_every_message_once_and_acks_each_batch_when_the_next_is_taken(
        client, stream_name):
    publish(client, stream_name, 5000)
    offsets: list[int] = []
    with client.receive_batches(stream_name, "g", max=700, wait=0.2, until_empty=True) as it:
        for batch in it:
            assert len(batch) <= 700
            offsets += batch.offsets.tolist()
            assert set(batch.table.column("attempt").to_pylist()) == {1}
    # Calls in flight may be served in any order: each batch is a run of
    # offsets, and together they are every message once.
    assert len(offsets) == 5000 and sorted(offsets) == list(range(5000))
    info = client.describe_group(stream_name, "g")
    assert (info.committed_offset, info.in_flight) == (5000, 0)  # the last acks are durable


def test_the_next_batch_is_leased_while_the_application_holds_one(client, stream_name):
    publish(client, stream_name, 1000)
    with client.receive_batches(stream_name, "g", max=100, prefetch=1) as it:
        first = next(it)
        assert first.offsets.tolist() == list(range(100))
        wait_for_in_flight(client, stream_name, "g", 200)  # the prefetched one
        second = next(it)
        assert second.offsets.tolist() == list(range(100, 200))
        # Taking the second acked the first, on a call of its own that also leases the
        # third: in flight stays 200 before and after it is served, so wait for the ack.
        wait_for_committed(client, stream_name, "g", 100)
        wait_for_in_flight(client, stream_name, "g", 200)
        second.ack()
    assert client.describe_group(stream_name, "g").committed_offset == 200


def test_by_default_three_calls_are_in_flight_beside_the_batch_held(client, stream_name):
    publish(client, stream_name, 1000)
    with client.receive_batches(stream_name, "g", max=100) as it:
        held = [next(it)]
        wait_for_in_flight(client, stream_name, "g", 400)  # held + 3 prefetched
        held += [next(it), next(it)]
        for batch in held:  # each a run of 100 offsets, none twice
            first = batch.offsets[0]
            assert batch.offsets.tolist() == list(range(first, first + 100))
        assert len({o for batch in held for o in batch.offsets.tolist()}) == 300
        # Taking the third acked the first two (each on the call sent when the next was
        # taken): 6 batches leased (offsets 0-599, in whichever order the calls were
        # served), 2 acked, so 400 in flight, and the committed offset is the lowest
        # offset not in those two.
        acked = {o for batch in held[:2] for o in batch.offsets.tolist()}
        committed = min(set(range(601)) - acked)
        wait_for_committed(client, stream_name, "g", committed)
        wait_for_in_flight(client, stream_name, "g", 400)
    # close() nacked the held batch and the three prefetched: nothing is left in flight.
    info = client.describe_group(stream_name, "g")
    assert (info.committed_offset, info.in_flight) == (committed, 0)


@pytest.mark.parametrize("prefetch", [-1, 17, 1.5, "2"])
def test_a_bad_prefetch_is_refused_naming_the_accepted_values(client, stream_name, prefetch):
    publish(client, stream_name, 1)
    with pytest.raises(InvalidArgument, match=r"prefetch must be an integer from 0 to 16 "
                                              r"\(calls in flight\), got"):
        client.receive_batches(stream_name, "g", prefetch=prefetch)


def test_without_prefetch_only_the_batch_asked_for_is_leased(client, stream_name):
    publish(client, stream_name, 300)
    with client.receive_batches(stream_name, "g", max=100, prefetch=False) as it:
        assert next(it).offsets.tolist() == list(range(100))
        time.sleep(0.3)
        assert client.describe_group(stream_name, "g").in_flight == 100
        assert next(it).offsets.tolist() == list(range(100, 200))
        info = client.describe_group(stream_name, "g")
        assert (info.committed_offset, info.in_flight) == (100, 100)


def test_close_releases_what_is_held_and_prefetched_to_other_members(client, stream_name):
    publish(client, stream_name, 400)
    it = client.receive_batches(stream_name, "g", max=100, member_id="a", prefetch=1)
    held = next(it)
    held.ack(range(0, 40))  # finished part of it
    wait_for_in_flight(client, stream_name, "g", 160)
    it.close()
    info = client.describe_group(stream_name, "g")
    assert (info.committed_offset, info.in_flight) == (40, 0)
    other = client.receive_batch(stream_name, "g", max=400, member_id="b")
    assert other.offsets.tolist() == list(range(40, 400))
    attempts = other.table.column("attempt").to_pylist()
    assert attempts == [2] * 160 + [1] * 200  # the released ones first, as redeliveries
    with pytest.raises(StopIteration):
        next(it)


def test_bad_arguments_fail_before_any_call(client, stream_name):
    with pytest.raises(InvalidArgument, match="max=0"):
        client.receive_batches(stream_name, "g", max=0)
    with pytest.raises(InvalidArgument, match=r"wait .*got -1"):
        client.receive_batches(stream_name, "g", wait=-1)


def test_key_order_holds_with_calls_in_flight(client, stream_name):
    client.create_stream(stream_name)
    client.publish_batch(stream_name, [{"key": f"k{i % 7}", "value": f"m{i}"}
                                       for i in range(700)])
    seen: dict[bytes, list[int]] = {}
    with client.receive_batches(stream_name, "g", max=50, wait=0.2, ordering="key",
                                prefetch=3, until_empty=True) as it:
        for batch in it:
            keys = batch.table.column("key").to_pylist()
            assert len(set(keys)) == len(keys)  # at most one message of a key in flight
            for key, offset in zip(keys, batch.offsets.tolist(), strict=True):
                seen.setdefault(key, []).append(offset)
    assert {key: offsets for key, offsets in seen.items()} == {
        f"k{k}".encode(): list(range(k, 700, 7)) for k in range(7)}

"""Shared groups (Nexo model: leases, ack/nack, redelivery, dead letters) on a real broker."""

from __future__ import annotations

import contextlib
import itertools
import queue
import subprocess
import sys
import threading
import time

import grpc
import pytest

from npstream.broker.groups.dead_letter import DLQ_HEADERS
from npstream.errors import GroupNotFound, InvalidArgument, StreamNotFound
from npstream.groups.shared import ack_leases
from npstream.proto import pb


def publish(client, stream: str, count: int, prefix: str = "m") -> None:
    client.publish_batch(stream, [{"value": f"{prefix}{i}"} for i in range(count)])


def wait_until(predicate, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_receive_three_workers_acking_process_every_message_exactly_once(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, 300)
    got: list[list[int]] = [[], [], []]

    def worker(index: int) -> None:
        idle = 0
        while idle < 2:
            leases = client.receive(stream_name, "workers", max=10, wait=0.3,
                                    member_id=f"worker-{index}")
            idle = 0 if leases else idle + 1
            for lease in leases:
                time.sleep(0.001)  # some work
                got[index].append(lease.offset)
            ack_leases(client, leases)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    everything = [o for part in got for o in part]
    assert sorted(everything) == list(range(300))  # all of them, none twice
    assert all(part for part in got), [len(p) for p in got]
    info = client.describe_group(stream_name, "workers")
    assert (info.kind, info.committed_offset, info.lag, info.in_flight) == ("shared", 300, 0, 0)
    assert sorted(m.member_id for m in info.members) == ["worker-0", "worker-1", "worker-2"]


def test_subscribe_three_members_handle_every_message_once_and_commit_all(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, 200)
    handled: list[tuple[str, int]] = []
    lock = threading.Lock()

    def handler_for(name: str):
        def handle(lease) -> None:
            with lock:
                handled.append((name, lease.offset))
        return handle

    subs = [client.subscribe(stream_name, "push", handler_for(f"s{i}"), max_in_flight=5)
            for i in range(3)]
    try:
        wait_until(lambda: len(handled) >= 200, what="200 deliveries")
        wait_until(lambda: client.describe_group(stream_name, "push").committed_offset == 200,
                   what="committed offset 200")
    finally:
        for sub in subs:
            sub.stop()
    assert sorted(o for _, o in handled) == list(range(200))
    info = client.describe_group(stream_name, "push")
    assert (info.in_flight, info.lag) == (0, 0)


WORKER_THAT_DIES = """
import os, sys
from npstream import Client
with Client(sys.argv[1]) as client:
    leases = client.receive(sys.argv[2], "jobs", max=5, ack_wait=1.0, member_id="doomed")
    print(len(leases), flush=True)
    os._exit(9)  # dies holding its leases
"""


def test_receive_worker_dies_holding_leases_others_get_them_after_ack_wait(
        client, stream_name, broker):
    client.create_stream(stream_name)
    publish(client, stream_name, 5)
    done = subprocess.run([sys.executable, "-c", WORKER_THAT_DIES, broker.address, stream_name],
                          capture_output=True, text=True, timeout=60)
    died_at = time.monotonic()
    assert done.returncode == 9 and done.stdout.strip() == "5", done.stderr
    assert client.receive(stream_name, "jobs", max=10, ack_wait=1.0) == []  # still leased
    leases = client.receive(stream_name, "jobs", max=10, wait=10.0, ack_wait=1.0,
                            member_id="survivor")
    assert time.monotonic() - died_at < 10.0
    while len(leases) < 5:
        leases += client.receive(stream_name, "jobs", max=10, wait=2.0, member_id="survivor")
    assert sorted(lease.offset for lease in leases) == [0, 1, 2, 3, 4]
    assert {lease.attempt for lease in leases} == {2}
    assert ack_leases(client, leases) == 5
    assert client.describe_group(stream_name, "jobs").committed_offset == 5


def test_nack_redelivers_now_and_with_delay_not_before_it(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, 2)
    first, second = client.receive(stream_name, "g", max=2)
    first.nack()
    (again,) = client.receive(stream_name, "g", max=10)
    assert (again.offset, again.attempt, again.value) == (0, 2, b"m0")
    again.ack()

    second.nack(delay=0.6)
    nacked_at = time.monotonic()
    assert client.receive(stream_name, "g", max=10) == []
    (late,) = client.receive(stream_name, "g", max=10, wait=5.0)
    assert time.monotonic() - nacked_at >= 0.55
    assert (late.offset, late.attempt) == (1, 2)


def test_backoff_spaces_redeliveries_and_last_value_repeats(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, 1)
    times = []
    for _ in range(4):
        (lease,) = client.receive(stream_name, "g", wait=5.0, backoff=[0.3, 0.6])
        times.append(time.monotonic())
        lease.nack()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert 0.28 <= gaps[0] < 2.0
    assert 0.58 <= gaps[1] < 2.5
    assert 0.58 <= gaps[2] < 2.5
    assert lease.attempt == 4


def test_max_deliver_sends_message_to_dead_letter_stream_with_headers(client, stream_name):
    client.create_stream(stream_name)
    client.publish(stream_name, "poison", id="p-1", key="k1", headers={"trace": "t-9"})
    client.publish(stream_name, "fine")
    for _ in range(2):
        leases = client.receive(stream_name, "g", max=1, wait=5.0, max_deliver=2)
        assert [lease.offset for lease in leases] == [0]
        leases[0].nack()
    (fine,) = client.receive(stream_name, "g", max=5, wait=5.0, max_deliver=2)
    assert fine.offset == 1
    fine.ack()

    dlq = client.fetch(f"{stream_name}.dlq", 0)
    assert dlq.num_rows == 1
    row = dlq.to_pylist()[0]
    headers = dict(row["headers"])
    assert (row["value"], row["key"]) == (b"poison", b"k1")
    assert headers["trace"] == b"t-9"
    assert headers[DLQ_HEADERS["stream"]] == stream_name.encode()
    assert headers[DLQ_HEADERS["group"]] == b"g"
    assert headers[DLQ_HEADERS["offset"]] == b"0"
    assert headers[DLQ_HEADERS["attempts"]] == b"2"
    assert headers[DLQ_HEADERS["id"]] == b"p-1"
    assert headers[DLQ_HEADERS["reason"]] == b"nack"
    info = client.describe_group(stream_name, "g")
    assert (info.dead_lettered, info.committed_offset, info.lag, info.in_flight) == (1, 2, 0, 0)
    assert info.settings.dead_letter_stream == f"{stream_name}.dlq"
    assert client.receive(stream_name, "g", max=5, max_deliver=2) == []


def test_expired_last_attempt_is_dead_lettered_without_any_receive(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, 1)
    target = f"{stream_name}-failed"
    (lease,) = client.receive(stream_name, "g", ack_wait=0.3, max_deliver=1,
                              dead_letter_stream=target)
    wait_until(lambda: target in {s.name for s in client.list_streams(prefix=target)}
               and client.fetch(target, 0).num_rows == 1, what="dead-letter copy")
    headers = dict(client.fetch(target, 0).to_pylist()[0]["headers"])
    assert headers[DLQ_HEADERS["reason"]] == b"expired"
    # The count follows the fsynced copy by moments.
    wait_until(lambda: client.describe_group(stream_name, "g").dead_lettered == 1,
               what="dead-lettered count")
    lease.ack()  # too late: already dead-lettered, counts nothing
    assert client.describe_group(stream_name, "g").committed_offset == 1


def test_delete_before_leaves_no_pending_leases(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, 8)
    leases = client.receive(stream_name, "g", max=5, member_id="m")
    assert [lease.offset for lease in leases] == [0, 1, 2, 3, 4]
    client.delete_messages(stream_name, before_offset=3)
    info = client.describe_group(stream_name, "g")
    assert (info.committed_offset, info.in_flight, info.lag) == (3, 2, 5)
    assert [m.in_flight for m in info.members] == [2]
    assert ack_leases(client, leases[:3]) == 0  # gone: nothing to ack
    assert ack_leases(client, leases[3:]) == 2
    rest = client.receive(stream_name, "g", max=10)
    assert [lease.offset for lease in rest] == [5, 6, 7]
    ack_leases(client, rest)

    client.receive(stream_name, "g", max=10)  # nothing left
    publish(client, stream_name, 3, prefix="later")
    held = client.receive(stream_name, "g", max=10)
    client.delete_messages(stream_name)  # delete all
    info = client.describe_group(stream_name, "g")
    assert (info.committed_offset, info.in_flight, info.lag) == (11, 0, 0)
    assert ack_leases(client, held) == 0


def test_subscribe_credits_bound_unacked_deliveries(client, stream_name, broker):
    """Raw Subscribe: the broker never has more unacked deliveries out than credits."""
    from npstream.proto import pb_grpc

    client.create_stream(stream_name)
    publish(client, stream_name, 10)
    requests: queue.SimpleQueue = queue.SimpleQueue()
    opening = pb.SubscribeRequest(credits=3)
    opening.open.CopyFrom(pb.SubscribeRequest.Open(stream=stream_name, group="fc",
                                                   member_id="slow"))
    requests.put(opening)

    def request_iter():
        while (item := requests.get()) is not None:
            yield item

    channel = grpc.insecure_channel(broker.address)
    call = pb_grpc.GroupServiceStub(channel).Subscribe(request_iter())
    received: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        try:
            for delivery in call:
                received.put(delivery)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.CANCELLED  # by the finally below

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        first = [received.get(timeout=10) for _ in range(3)]
        assert [d.offset for d in first] == [0, 1, 2]
        time.sleep(0.6)
        assert received.empty()  # no credit, no delivery, although 7 are waiting
        assert client.describe_group(stream_name, "fc").in_flight == 3
        requests.put(pb.SubscribeRequest(ack_offsets=[0], credits=1))
        assert received.get(timeout=10).offset == 3
        time.sleep(0.4)
        assert received.empty()
        info = client.describe_group(stream_name, "fc")
        assert (info.in_flight, info.committed_offset) == (3, 1)
        assert [(m.member_id, m.in_flight) for m in info.members] == [("slow", 3)]
    finally:
        requests.put(None)
        call.cancel()
        channel.close()


def test_subscription_max_in_flight_limits_concurrent_handlers(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, 30)
    running = 0
    peak = 0
    lock = threading.Lock()
    handled: list[int] = []
    broker_in_flight: list[int] = []

    def handle(lease) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.03)
        with lock:
            running -= 1
            handled.append(lease.offset)

    with client.subscribe(stream_name, "fc2", handle, max_in_flight=2):
        deadline = time.monotonic() + 30
        while len(handled) < 30 and time.monotonic() < deadline:
            with contextlib.suppress(GroupNotFound):  # until the subscription creates it
                broker_in_flight.append(client.describe_group(stream_name, "fc2").in_flight)
            time.sleep(0.05)
    assert sorted(handled) == list(range(30))
    assert peak == 2
    assert max(broker_in_flight) <= 2


def test_subscription_handler_error_nacks_and_message_comes_back(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, 1)
    attempts: list[int] = []

    def flaky(lease) -> None:
        attempts.append(lease.attempt)
        if lease.attempt == 1:
            raise RuntimeError("transient")
        lease.ack()

    sub = client.subscribe(stream_name, "g", flaky, max_in_flight=1)
    try:
        wait_until(lambda: len(attempts) >= 2, what="redelivery after handler error")
        wait_until(lambda: client.describe_group(stream_name, "g").committed_offset == 1,
                   what="ack")
    finally:
        sub.stop()
    assert attempts == [1, 2]
    assert not sub.running


def test_subscription_on_deleted_group_ends_with_not_found(client, stream_name):
    client.create_stream(stream_name)
    sub = client.subscribe(stream_name, "g", lambda lease: None)

    def subscribed() -> bool:
        try:
            return bool(client.describe_group(stream_name, "g").members)
        except GroupNotFound:  # the subscription has not created it yet
            return False

    wait_until(subscribed, what="member")
    client.delete_group(stream_name, "g")
    with pytest.raises(GroupNotFound):
        sub.join(10)
    assert not sub.running


def test_subscribe_returns_joined_or_raises_at_once(client, stream_name):
    with pytest.raises(StreamNotFound, match=stream_name):
        client.subscribe(stream_name, "g", lambda lease: None)
    client.create_stream(stream_name)
    with client.subscribe(stream_name, "g", lambda lease: None, member_id="m-1") as sub:
        info = client.describe_group(stream_name, "g")  # no race: the member has joined
        assert [m.member_id for m in info.members] == ["m-1"]
        assert sub.running
    assert not sub.running


def test_seek_shared_group_redelivers_from_the_target(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, 4)
    ack_leases(client, client.receive(stream_name, "g", max=10))
    response = client.call("GroupService.Seek", pb.SeekRequest(
        stream=stream_name, group="g", to=pb.StartFrom(offset=2)))
    assert response.position.committed_offset == 2
    assert [lease.offset for lease in client.receive(stream_name, "g", max=10)] == [2, 3]


def test_shared_group_errors_have_clear_codes(client, stream_name):
    with pytest.raises(StreamNotFound, match=stream_name):
        client.receive(stream_name, "g")
    client.create_stream(stream_name)
    with pytest.raises(GroupNotFound):
        client.call("GroupService.Ack", pb.AckRequest(stream=stream_name, group="none",
                                                      offsets=[0]))
    with pytest.raises(InvalidArgument, match="must differ from the stream itself"):
        client.receive(stream_name, "g", dead_letter_stream=stream_name)
    with pytest.raises(InvalidArgument, match="max_deliver"):
        client.receive(stream_name, "g", max_deliver=-1)
    publish(client, stream_name, 1)
    (lease,) = client.receive(stream_name, "g")
    with pytest.raises(InvalidArgument, match="nack delay: invalid duration -1"):
        lease.nack(delay=-1)
    assert lease.settled == ""  # still ours to settle
    lease.ack()
    with pytest.raises(InvalidArgument, match="is a shared group"):
        client.consumer(stream_name, "g")


def test_two_shared_groups_each_get_everything(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, 5)
    for group in ("email", "audit"):
        leases = client.receive(stream_name, group, max=10)
        assert [lease.offset for lease in leases] == [0, 1, 2, 3, 4]
        ack_leases(client, leases)
    assert {g.group: g.committed_offset for g in client.list_groups(stream_name)} == {
        "audit": 5, "email": 5}


def test_metrics_count_deliveries_redeliveries_acks_nacks_and_pulls(broker_factory):
    from npstream import Client

    broker = broker_factory()
    with Client(broker.address) as client:
        client.create_stream("m")
        publish(client, "m", 2)
        first, second = client.receive("m", "shared", max=2)
        first.nack()
        (again,) = client.receive("m", "shared", max=2)
        ack_leases(client, [again, second])
        client.consumer("m", "cursor").pull(limit=10)
    metrics = broker.metrics()
    assert metrics["npstream_group_deliveries_total"] == 3
    assert metrics["npstream_group_redeliveries_total"] == 1
    assert metrics["npstream_group_acks_total"] == 2
    assert metrics["npstream_group_nacks_total"] == 1
    assert metrics["npstream_group_dead_letters_total"] == 0
    assert metrics["npstream_group_pulled_messages_total"] == 2

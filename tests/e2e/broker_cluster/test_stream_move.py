"""Moving a stream between two real brokers of a cluster (issue 19): `streams move`.

A stream with messages (producer ids), a cursor group, a shared group with
acks and a sink commit moves from one member to the other; what was
acknowledged is there exactly once and in order, the groups continue from
their positions, the dedup window and the sink's committed batches went
along, and a client that knew the old member reaches the new one. Publishers
that keep writing through the move lose and duplicate nothing. Then each
step of the move is cut off by the broker's fault hook (NPSTREAM_MOVE_FAULT,
the process exits as kill -9 would leave it), on the source and on the
target: after the restart, exactly one member holds the stream and all of
the above holds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from cluster_members import (
    LOCAL,
    cluster_of,
    held,
    move_raw,
    names_on,
    read_ids,
    start_members,
    wait_until,
)
from harness import BrokerProcess, shared_etcd
from npstream import Client
from npstream.broker.cluster.etcd.client import EtcdClient
from npstream.broker.cluster.placement import rendezvous_owner
from npstream.broker.faults import FAULT_EXIT_CODE, MOVE_FAULT_ENV
from npstream.proto import pb, pb_grpc
from npstream.proto.schema import MESSAGE_SCHEMA

pytestmark = pytest.mark.slow

MESSAGES = 40


@pytest.fixture(scope="module")
def members(cluster_members: list[BrokerProcess]) -> list[BrokerProcess]:
    """The module's two members (tests/e2e/broker_cluster/conftest.py)."""
    return cluster_members


@pytest.fixture(autouse=True)
def both_up(members: list[BrokerProcess]) -> Iterator[None]:
    yield
    for broker in members:
        if broker.extra_env.pop(MOVE_FAULT_ENV, None) is not None or (
                broker.proc is None or broker.proc.poll() is not None):
            broker.kill()
            broker.start()


def name_on(members: list[BrokerProcess], broker: BrokerProcess, prefix: str) -> str:
    return names_on(broker.address, [b.address for b in members], prefix)[0]


def local_groups(broker: BrokerProcess, stream: str) -> dict[str, int]:
    with grpc.insecure_channel(broker.address) as channel:
        try:
            reply = pb_grpc.GroupServiceStub(channel).ListGroups(
                pb.ListGroupsRequest(stream=stream), metadata=LOCAL, timeout=10)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return {}
    return {group.group: group.committed_offset for group in reply.groups}


def fill(client: Client, stream: str, sink_id: str) -> None:
    """Messages with ids, a cursor group at 15, a shared group with 0..9 acked, a sink batch."""
    client.create_stream(stream, dedup_window="1h")
    client.publish_batch(stream, [{"value": f"{i}".encode(), "id": f"m{i}"}
                                  for i in range(MESSAGES - 5)])
    cursor = client.consumer(stream, "cursor")
    assert len(cursor.pull(15)) == 15
    cursor.commit()
    leases = client.receive(stream, "shared", 10, ack_wait=30)
    for lease in leases:
        lease.ack()
    sink = client.sink()
    rows = pa.table({"value": [f"{i}".encode() for i in range(MESSAGES - 5, MESSAGES)],
                     "id": [f"m{i}" for i in range(MESSAGES - 5, MESSAGES)]})
    staged = sink.stage(sink_id, 0, "s0", stream, rows)
    sink.commit_all(sink_id, 0, {b: ["s0"] for b in staged.brokers})


def check_moved(members: list[BrokerProcess], stream: str, sink_id: str,
                source: BrokerProcess, target: BrokerProcess) -> None:
    """Exactly one owner (the target) and everything that went with the stream."""
    assert stream in held(target) and stream not in held(source)
    assert local_groups(target, stream) == {"cursor": 15, "shared": 10}
    assert local_groups(source, stream) == {}
    expected = [f"m{i}" for i in range(MESSAGES)]
    with Client(source.address) as client:  # a client of the old owner is redirected
        assert client.broker_of(stream) == target.address
        assert read_ids(client, stream) == expected
        again = client.publish(stream, b"again", id="m3")  # the dedup window came along
        assert (again.duplicate, again.offset) == (True, 3)
        assert client.publish(stream, b"new", id="new").offset == MESSAGES
        assert [m.offset for m in client.consumer(stream, "cursor").pull(2)] == [15, 16]
        leases = client.receive(stream, "shared", 3, ack_wait=30)
        assert [lease.offset for lease in leases] == [10, 11, 12]
        sink = client.sink()  # batch 0 replayed: committed already for this stream
        rows = pa.table({"value": [b"dup"], "id": ["dup"]})
        staged = sink.stage(sink_id, 0, "s1", stream, rows)
        assert staged.brokers == (target.address,)
        result = sink.commit_all(sink_id, 0, {b: ["s1"] for b in staged.brokers})
        assert result.written[stream] == (MESSAGES + 1, MESSAGES + 1)  # nothing appended
        assert read_ids(client, stream) == [*expected, "new"]


def test_a_moved_stream_takes_its_messages_groups_dedup_and_sink_state(members):
    source, target = members
    stream = name_on(members, source, f"mv{uuid.uuid4().hex[:6]}")
    sink_id = f"sink-{stream}"
    with Client(target.address) as client:
        fill(client, stream, sink_id)
        result = client.move_stream(stream, target.address)
        assert (result.source, result.target, result.end_offset, result.groups) == (
            source.address, target.address, MESSAGES, 2)
        assert result.bytes > 0 and not result.already_there
        assert client.move_stream(stream, target.address).already_there
    check_moved(members, stream, sink_id, source, target)


def test_publishers_writing_through_a_move_lose_and_duplicate_nothing(members):
    source, target = members
    stream = name_on(members, source, f"mvp{uuid.uuid4().hex[:6]}")
    acked: dict[int, list[str]] = {0: [], 1: []}
    stop = threading.Event()
    errors: list[BaseException] = []

    def publish(worker: int) -> None:
        try:
            with Client(source.address, retry_deadline=60) as client:
                n = 0
                while not stop.is_set():
                    message_id = f"w{worker}-{n}"
                    client.publish(stream, message_id.encode(), id=message_id)
                    acked[worker].append(message_id)
                    n += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    with Client(source.address) as admin:
        admin.create_stream(stream, dedup_window="1h")
        threads = [threading.Thread(target=publish, args=(w,)) for w in (0, 1)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        result = admin.move_stream(stream, target.address)
        time.sleep(1.0)
        stop.set()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        ids = read_ids(admin, stream)
    assert result.end_offset > 0
    assert len(ids) == len(set(ids))
    for worker in (0, 1):
        mine = [i for i in ids if i.startswith(f"w{worker}-")]
        assert mine == acked[worker]  # every acknowledged one, once, in order
    assert stream in held(target) and stream not in held(source)


# (broker that dies, fault step): every step of the move on the source, and the
# target's receiving of a file and its install.
CRASHES = [("source", "paused"), ("source", "copied"), ("source", "switching"),
           ("source", "switched"), ("source", "removed"), ("target", "file"),
           ("target", "installed")]


@pytest.mark.parametrize(("who", "step"), CRASHES, ids=[f"{w}-{s}" for w, s in CRASHES])
def test_a_crash_at_any_step_of_a_move_leaves_exactly_one_owner(members, who, step):
    source, target = members
    stream = name_on(members, source, f"mvc{step}{uuid.uuid4().hex[:6]}")
    sink_id = f"sink-{stream}"
    with Client(target.address) as client:
        fill(client, stream, sink_id)
    dying = source if who == "source" else target
    dying.extra_env[MOVE_FAULT_ENV] = step
    dying.restart()
    status = move_raw(source, stream, target.address)
    assert status != grpc.StatusCode.OK
    assert dying.proc is not None and dying.proc.wait(30) == FAULT_EXIT_CODE
    dying.extra_env.pop(MOVE_FAULT_ENV)
    dying.start()
    # The source resumes the move by itself (at its start, or on its next retry).
    wait_until(lambda: stream in held(target) and stream not in held(source))
    check_moved(members, stream, sink_id, source, target)
    assert Path(source.data_dir / "streams" / stream).exists() is False


def npstream(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npstream.cli", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_cli_moves_a_stream_and_back(members):
    source, target = members
    stream = name_on(members, source, f"mvcli{uuid.uuid4().hex[:6]}")
    with Client(source.address) as client:
        client.publish_batch(stream, [{"value": b"x", "id": f"c{i}"} for i in range(5)])
    done = npstream("streams", "move", stream, "--to", target.address, "--json",
                    "--broker", target.address)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert (reply["source"], reply["target"], reply["end_offset"], reply["already_there"]) == (
        source.address, target.address, 5, False)
    again = npstream("streams", "move", stream, "--to", target.address, "--broker",
                     source.address)
    assert again.returncode == 0 and "already" in again.stdout
    back = npstream("streams", "move", stream, "--to", source.address, "--broker",
                    source.address)
    assert back.returncode == 0, back.stderr
    assert f"from {target.address} to {source.address}: 5 offsets" in back.stdout
    assert stream in held(source) and stream not in held(target)
    with Client(target.address) as client:
        assert read_ids(client, stream) == [f"c{i}" for i in range(5)]
    wrong = npstream("streams", "move", stream, "--to", "127.0.0.1:1", "--broker",
                     source.address)
    assert wrong.returncode != 0 and "not a member of the cluster" in wrong.stderr


def etcd_record(broker: BrokerProcess, stream: str) -> tuple[dict, int]:
    """The stream's owner record in etcd and its mod_revision."""
    client = EtcdClient(shared_etcd().endpoint)  # type: ignore[attr-defined]
    try:
        kv = client.get(f"/npstream/{cluster_of(broker)}/streams/{stream}")
    finally:
        client.close()
    assert kv is not None, f"no etcd record of {stream}"
    return json.loads(kv.value), kv.mod_revision


def member_id(broker: BrokerProcess) -> str:
    return (broker.data_dir / "member-id").read_text().strip()


def test_a_move_rewrites_the_streams_etcd_record_to_the_target(members):
    source, target = members
    stream = name_on(members, source, f"mvrec{uuid.uuid4().hex[:6]}")
    with Client(target.address) as client:  # created through the other member
        client.publish(stream, b"x", id="r0")
    before, revision = etcd_record(source, stream)
    assert before == {"replicas": [member_id(source)], "leader": member_id(source),
                      "leader_epoch": 1, "isr": [member_id(source)]}
    with Client(source.address) as client:
        client.move_stream(stream, target.address)
    after, moved_revision = etcd_record(source, stream)
    assert after == {"replicas": [member_id(target)], "leader": member_id(target),
                     "leader_epoch": 1, "isr": [member_id(target)]}
    assert moved_revision > revision
    with Client(source.address) as client:  # routed by the record: to the target
        assert client.broker_of(stream) == target.address
        client.delete_stream(stream)
    with pytest.raises(AssertionError, match="no etcd record"):
        etcd_record(source, stream)


def dead_letter_ids(client: Client, stream: str) -> list[str]:
    return client.fetch(stream, 0).column("id").to_pylist()


def test_dead_letter_streams_move_with_their_group_stream(members):
    source, target = members
    stream = name_on(members, source, f"mvd{uuid.uuid4().hex[:6]}")
    dlq = f"{stream}.dlq"
    with Client(source.address) as client:
        client.publish_batch(stream, [{"value": b"x", "id": f"d{i}"} for i in range(3)])
        (lease,) = client.receive(stream, "g", 1, max_deliver=1, ack_wait=30)
        lease.nack()
        wait_until(lambda: dlq in held(source), 10)  # created with its group's stream
        result = client.move_stream(stream, target.address)
        assert result.dead_letter_streams == (dlq,)
        assert {stream, dlq} <= held(target) and not {stream, dlq} & held(source)
        (lease,) = client.receive(stream, "g", 1, max_deliver=1, ack_wait=30)
        assert lease.offset == 1
        lease.nack()
        wait_until(lambda: len(dead_letter_ids(client, dlq)) == 2, 10)
        assert dead_letter_ids(client, dlq) == [f"dlq:{stream}:g:0", f"dlq:{stream}:g:1"]
        assert dlq not in held(source)


def test_a_dead_letter_stream_another_member_holds_is_never_created_twice(members):
    source, target = members
    addresses = [b.address for b in members]
    tag = uuid.uuid4().hex[:6]
    stream = next(name for name in (f"mve{tag}-{i}" for i in range(1000))
                  if rendezvous_owner(name, addresses) == source.address
                  and rendezvous_owner(f"{name}.dlq", addresses) == target.address)
    dlq = f"{stream}.dlq"
    with Client(source.address) as client:
        client.create_stream(dlq)  # placed on the target
        assert dlq in held(target)
        client.publish(stream, b"x", id="e0")
        (lease,) = client.receive(stream, "g", 1, max_deliver=1, ack_wait=30)
        lease.nack()
        wait_until(lambda: "dead-letter stream" in source.log_text()
                   and "is held by cluster member" in source.log_text(), 10)
        assert dlq not in held(source) and dead_letter_ids(client, dlq) == []
        # Co-located again (moved to its group's member), dead-lettering goes on.
        assert client.move_stream(dlq, source.address).target == source.address
        (lease,) = client.receive(stream, "g", 1, wait=15, max_deliver=1, ack_wait=30)
        lease.nack()
        wait_until(lambda: dead_letter_ids(client, dlq) == [f"dlq:{stream}:g:0"], 10)
    assert dlq in held(source) and dlq not in held(target)


def test_a_subscriber_goes_on_at_the_new_member_from_its_position(members):
    source, target = members
    stream = name_on(members, source, f"mvs{uuid.uuid4().hex[:6]}")
    handled: list[int] = []
    lock = threading.Lock()

    def handle(lease: object) -> None:
        with lock:
            handled.append(lease.offset)  # type: ignore[attr-defined]

    with Client(source.address) as client:
        client.publish_batch(stream, [{"value": b"x", "id": f"s{i}"} for i in range(20)])
        subscription = client.subscribe(stream, "workers", handle, ack_wait=30)
        try:
            wait_until(lambda: len(set(handled)) >= 20, 30)
            client.move_stream(stream, target.address)
            client.publish_batch(stream, [{"value": b"x", "id": f"s{i}"}
                                          for i in range(20, 40)])
            wait_until(lambda: set(range(40)) <= set(handled), 60)
        finally:
            subscription.stop()
        wait_until(lambda: client.describe_group(stream, "workers").committed_offset == 40, 30)
    assert local_groups(target, stream) == {"workers": 40}
    assert stream not in held(source)


def test_a_long_poll_on_the_stream_does_not_hold_up_its_move(members):
    source, target = members
    stream = name_on(members, source, f"mvl{uuid.uuid4().hex[:6]}")
    got: list[list[str]] = []
    with Client(source.address) as client:
        client.publish(stream, b"x", id="l0")

        def poll() -> None:
            with Client(source.address, retry_deadline=60) as reader:
                got.append(reader.fetch(stream, 1, wait=60).column("id").to_pylist())

        poller = threading.Thread(target=poll)
        poller.start()
        time.sleep(1.0)  # the Fetch waits at the end of the stream
        started = time.monotonic()
        result = client.move_stream(stream, target.address)
        assert time.monotonic() - started < 20 and result.end_offset == 1
        client.publish(stream, b"y", id="l1")
        poller.join(60)
    assert got == [["l1"]]  # the poll went on at the new member and got the new message


def test_a_pipelined_batch_publish_without_ids_goes_on_through_a_move(members):
    source, target = members
    stream = name_on(members, source, f"mvb{uuid.uuid4().hex[:6]}")
    values = [f"{i:06d}".encode() * 200 for i in range(50_000)]  # ~60 MB: many requests
    stored: list[int] = []
    with Client(source.address) as client:
        client.create_stream(stream)

        def publish() -> None:
            with Client(source.address, retry_deadline=60) as writer:
                stored.append(writer.publish_batch(stream, pa.table({"value": values}))
                              .stored_count)

        publisher = threading.Thread(target=publish)
        publisher.start()
        deadline = time.monotonic() + 30
        while client.stream_info(stream).end_offset == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        moved = client.move_stream(stream, target.address)
        assert moved.end_offset < len(values)  # paused in the middle of the publish
        publisher.join(120)
        assert stored == [len(values)]
        batches = list(client.read_range(stream, 0, len(values)))
        info = client.stream_info(stream)
    assert info.end_offset == len(values)  # none lost, none twice, although without ids
    read = pa.Table.from_batches(batches, schema=MESSAGE_SCHEMA).column("value").to_pylist()
    assert read == values  # in order
    assert stream in held(target) and stream not in held(source)


def test_a_batch_publish_of_an_iterator_goes_on_through_a_move(members):
    """An iterator cannot be rewound: the client resends what was not answered, to the new
    member, without ids, and nothing is lost, stored twice or reordered."""
    source, target = members
    stream = name_on(members, source, f"mvi{uuid.uuid4().hex[:6]}")
    values = [f"{i:06d}".encode() * 200 for i in range(50_000)]  # ~60 MB over 25 tables
    taken: list[int] = []
    stored: list[int] = []
    errors: list[BaseException] = []

    def tables() -> Iterator[pa.Table]:
        for start in range(0, len(values), 2000):
            taken.append(start)
            yield pa.table({"value": values[start:start + 2000]})

    with Client(source.address) as client:
        client.create_stream(stream)

        def publish() -> None:
            try:
                with Client(source.address, retry_deadline=60) as writer:
                    stored.append(writer.publish_batch(stream, tables()).stored_count)
            except BaseException as exc:  # reported below
                errors.append(exc)

        publisher = threading.Thread(target=publish)
        publisher.start()
        deadline = time.monotonic() + 30
        while client.stream_info(stream).end_offset == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        moved = client.move_stream(stream, target.address)
        publisher.join(120)
        assert not errors, errors
        assert moved.end_offset < len(values)  # paused in the middle of the publish
        assert stored == [len(values)]
        assert taken == list(range(0, len(values), 2000))  # each table taken once
        batches = list(client.read_range(stream, 0, len(values)))
        info = client.stream_info(stream)
    assert info.end_offset == len(values)  # none lost, none twice, although without ids
    read = pa.Table.from_batches(batches, schema=MESSAGE_SCHEMA).column("value").to_pylist()
    assert read == values  # in order
    assert stream in held(target) and stream not in held(source)


# (who is killed, seconds after the move starts): kill -9 from outside at moments
# the fault points do not name, on a stream big enough that the copy takes a while.
KILLS = [("source", 0.05), ("source", 0.3), ("target", 0.05), ("target", 0.3)]


@pytest.mark.parametrize(("who", "delay"), KILLS, ids=[f"{w}-{d}" for w, d in KILLS])
def test_kill_9_during_a_move_of_a_big_stream_leaves_exactly_one_owner(members, who, delay):
    source, target = members
    stream = name_on(members, source, f"mvk{uuid.uuid4().hex[:6]}")
    ids = [f"k{i}" for i in range(20_000)]
    with Client(source.address) as client:
        for start in range(0, len(ids), 5000):
            client.publish_batch(stream, pa.table({
                "value": [b"v" * 1000] * 5000, "id": ids[start:start + 5000]}))
        client.consumer(stream, "cursor").pull(123)
    outcome: list[grpc.StatusCode] = []
    mover = threading.Thread(target=lambda: outcome.append(
        move_raw(source, stream, target.address)))
    mover.start()
    time.sleep(delay)
    victim = source if who == "source" else target
    victim.kill()
    mover.join(60)
    victim.start()
    wait_until(lambda: len([b for b in members if stream in held(b)]) == 1, 60)
    # Exactly one owner: the target once the move finished (by itself, resumed by
    # the source), else the source (killed before the move was recorded, or still
    # resuming): running the move again finishes it.
    if stream in held(source):  # the SDK retries while the target's channel reconnects
        with Client(source.address, retry_deadline=30) as client:
            assert client.move_stream(stream, target.address).target == target.address
    wait_until(lambda: stream in held(target) and stream not in held(source), 60)
    with Client(source.address) as client:
        assert read_ids(client, stream) == ids
        assert client.describe_group(stream, "cursor").committed_offset == 123
        assert client.publish(stream, b"again", id="k7").duplicate


def test_a_stream_still_in_the_nursery_moves_with_its_first_message(tmp_path):
    """A one-message first publish once the LRU of open logs is full: no directory yet (its
    row and frame are in the nursery, broker/streams/nursery.py); the move writes it out."""
    brokers = start_members(tmp_path, ["a", "b"], env={"NPSTREAM_MAX_OPEN_LOGS": "1"})
    source, target = brokers
    try:
        stream = name_on(brokers, source, f"mvnur{uuid.uuid4().hex[:6]}")
        with Client(source.address) as client:
            client.publish_batch(name_on(brokers, source, "warm"), [{"value": b"w"}] * 2)
            assert client.publish(stream, b"first").offset == 0
            assert not (source.data_dir / "streams" / stream).exists()
            assert move_raw(source, stream, target.address) == grpc.StatusCode.OK
            assert stream in held(target) and stream not in held(source)
            assert client.fetch(stream, 0).column("value").to_pylist() == [b"first"]
            assert client.publish(stream, b"second").offset == 1
            assert client.fetch(stream, 0).column("value").to_pylist() == [b"first", b"second"]
    finally:
        for broker in brokers:
            broker.stop()

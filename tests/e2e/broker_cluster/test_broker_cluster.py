"""A cluster of three brokers on loopback, each registered in etcd (--etcd).

What a user of ``Client("any-member:7070")`` relies on: a new stream lands on
the member its name is placed on, whoever creates it and however many create
it at once; every call about a stream reaches its owner through redirects the
SDK follows; lists are the union of the members; groups, dedup state and sink
commit records live in the owner's data dir; a sink batch written to streams
on two members is exactly once per stream across a crash between (or during)
the two members' commits (the broker's fault hook); and Spark reads a
streamPattern across members and writes exactly once to streams on two of
them. Members are asked for their own streams with ``x-npstream-cluster-local``,
the way members ask each other.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pyarrow as pa
import pytest

from cluster_members import LOCAL, cluster_of, free_ports, held, read_ids, start_members
from harness import BrokerProcess
from npstream import BrokerUnavailable, Client, StreamNotFound
from npstream.broker.cluster.placement import rendezvous_owner
from npstream.broker.faults import FAULT_EXIT_CODE, SINK_FAULT_ENV
from npstream.proto import pb, pb_grpc

pytestmark = pytest.mark.slow

CLUSTER_SIZE = 3  # the module's cluster_members (tests/e2e/broker_cluster/conftest.py)


@dataclass
class Cluster:
    brokers: list[BrokerProcess]

    @property
    def members(self) -> list[str]:
        return [broker.address for broker in self.brokers]

    def owner(self, stream: str) -> BrokerProcess:
        """The member placement puts a new stream of this name on."""
        address = rendezvous_owner(stream, self.members)
        return next(b for b in self.brokers if b.address == address)

    def names_on(self, broker: BrokerProcess, prefix: str, count: int = 1) -> list[str]:
        """``count`` names of the form prefix-N that placement puts on ``broker``."""
        candidates = (f"{prefix}-{i}" for i in itertools.count())
        return list(itertools.islice(
            (name for name in candidates if self.owner(name) is broker), count))


def local_groups(broker: BrokerProcess, stream: str) -> set[str]:
    """The groups of ``stream`` in this member's own metadata (none: it lacks the stream)."""
    with grpc.insecure_channel(broker.address) as channel:
        try:
            reply = pb_grpc.GroupServiceStub(channel).ListGroups(
                pb.ListGroupsRequest(stream=stream), metadata=LOCAL, timeout=10)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return set()
    return {group.group for group in reply.groups}


@pytest.fixture(scope="module")
def cluster(cluster_members: list[BrokerProcess]) -> Cluster:
    """The module's three members (tests/e2e/broker_cluster/conftest.py)."""
    return Cluster(cluster_members)


@pytest.fixture(autouse=True)
def every_member_up(cluster: Cluster) -> Iterator[None]:
    """A test that stops or crashes a member leaves the next one a whole cluster."""
    yield
    for broker in cluster.brokers:
        broker.extra_env.pop(SINK_FAULT_ENV, None)
        if broker.proc is None or broker.proc.poll() is not None:
            broker.start()


@pytest.fixture
def prefix() -> str:
    return f"c{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------- placement


def test_a_new_stream_lands_on_its_placed_member_whoever_creates_it(cluster, prefix):
    names = [name for broker in cluster.brokers for name in cluster.names_on(broker, prefix, 2)]
    for via, name in zip(itertools.cycle(cluster.brokers), names):
        with Client(via.address) as client:
            assert client.create_stream(name, max_age="1h").name == name
    holdings = {broker.address: held(broker) for broker in cluster.brokers}
    for name in names:
        owner = cluster.owner(name)
        assert [a for a, names_held in holdings.items() if name in names_held] == [owner.address]
        for via in cluster.brokers:  # every member names the same owner
            with Client(via.address) as client:
                assert client.broker_of(name) == owner.address
                assert client.stream_info(name).config.max_age_ms == 3_600_000


def test_concurrent_creates_of_one_name_make_exactly_one_stream(cluster, prefix):
    for round_ in range(4):
        name = f"{prefix}-race-{round_}"
        start = threading.Barrier(6)
        errors: list[BaseException] = []

        def create_or_publish(index: int, name: str = name, start: threading.Barrier = start,
                              errors: list[BaseException] = errors) -> None:
            via = cluster.brokers[index % 3]
            try:
                with Client(via.address) as client:
                    start.wait()
                    if index % 2:
                        client.publish(name, {"from": index}, id=f"m{index}")
                    else:
                        client.create_stream(name, exist_ok=True)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=create_or_publish, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors
        assert [b for b in cluster.brokers if name in held(b)] == [cluster.owner(name)]
        with Client(cluster.brokers[0].address) as client:
            assert sorted(read_ids(client, name)) == ["m1", "m3", "m5"]


def test_an_existing_stream_stays_where_it_is_when_a_member_is_added(tmp_path, prefix):
    """Two members, then a third: placement changes for some names, their streams do not move."""
    ports = free_ports(3)
    members = [f"127.0.0.1:{port}" for port in ports]
    first = start_members(tmp_path, ["a", "b"], ports=ports[:2])
    added: list[BrokerProcess] = []
    try:
        # A name that two members place on one of them, and three on the newcomer.
        name = next(n for n in (f"{prefix}-{i}" for i in itertools.count())
                    if rendezvous_owner(n, members) == members[2])
        with Client(first[0].address) as client:
            client.publish_batch(name, [{"value": b"before", "id": f"b{i}"} for i in range(3)])
            consumer = client.consumer(name, "keeps")
            assert len(consumer.pull(2)) == 2
            consumer.commit()
        holder = next(b for b in first if name in held(b))
        added = start_members(tmp_path, ["c"], ports=ports[2:], cluster_name=cluster_of(first[0]))
        with Client(added[0].address) as client:  # through the newcomer
            assert client.broker_of(name) == holder.address
            assert client.publish(name, b"after", id="a0").offset == 3
            assert read_ids(client, name) == ["b0", "b1", "b2", "a0"]
            assert client.consumer(name, "keeps").position == 2
            fresh = f"{name}-new"
            client.create_stream(fresh)
        assert name not in held(added[0]) and name in held(holder)
        assert fresh in held(next(b for b in [*first, *added]
                                  if b.address == rendezvous_owner(fresh, members)))
    finally:
        for broker in [*first, *added]:
            broker.stop()


# ---------------------------------------------------------------- routing


def test_the_sdk_follows_redirects_for_every_kind_of_call(cluster, prefix):
    entry, owner = cluster.brokers[0], cluster.brokers[1]
    (stream,) = cluster.names_on(owner, prefix)
    with Client(entry.address) as client:
        client.create_stream(stream)
        assert client.publish(stream, {"n": 0}, id="p0").offset == 0
        client.publish_batch(stream, [{"value": f"{i}".encode(), "id": f"p{i}"}
                                      for i in range(1, 5)])
        tables = (pa.table({"value": [f"{i}".encode()], "id": [f"p{i}"]}) for i in range(5, 8))
        assert client.publish_batch(stream, tables).stored_count == 3  # PublishStream
        assert client.broker_of(stream) == owner.address
        assert client.fetch(stream, 0).column("id").to_pylist() == [f"p{i}" for i in range(8)]
        batches, next_offset = client.read_batches(stream, 2, end_offset=6)  # local reads
        assert next_offset == 6 and sum(b.num_rows for b in batches) == 4
        assert client.end_offsets([stream]) == {stream: (0, 8)}
        assert client.offset_for_timestamp(stream, 0) == 0
        cursor = client.consumer(stream, "cursor")
        assert [m.offset for m in cursor.pull(3)] == [0, 1, 2]
        cursor.commit()
        leases = client.receive(stream, "shared", 4, ack_wait=30)
        assert [lease.offset for lease in leases] == [0, 1, 2, 3]
        for lease in leases:
            lease.ack()
        seen: list[int] = []
        done = threading.Event()

        def handle(lease: object) -> None:
            seen.append(lease.offset)  # type: ignore[attr-defined]
            if len(seen) >= 4:
                done.set()

        subscription = client.subscribe(stream, "shared", handle)
        assert done.wait(30)
        subscription.stop()
        assert sorted(seen)[:4] == [4, 5, 6, 7]
        assert {g.group for g in client.list_groups(stream)} == {"cursor", "shared"}
        assert client.describe_group(stream, "cursor").committed_offset == 3
    with Client(entry.address, local_reads=False) as remote:  # ReadRange over gRPC
        assert read_ids(remote, stream) == [f"p{i}" for i in range(8)]
    # Everything keyed by the stream is in its owner's data dir, nowhere else.
    assert stream in held(owner)
    assert local_groups(owner, stream) == {"cursor", "shared"}
    for other in (cluster.brokers[0], cluster.brokers[2]):
        assert stream not in held(other) and local_groups(other, stream) == set()


def test_dedup_state_goes_with_the_stream(cluster, prefix):
    (stream,) = cluster.names_on(cluster.brokers[2], prefix)
    with Client(cluster.brokers[0].address) as first:
        assert first.publish(stream, b"once", id="same").duplicate is False
    with Client(cluster.brokers[1].address) as second:
        again = second.publish(stream, b"once", id="same")
        assert (again.duplicate, again.offset) == (True, 0)
        assert read_ids(second, stream) == ["same"]


def test_lists_and_end_offsets_are_the_union_of_all_members(cluster, prefix):
    names = sorted(name for broker in cluster.brokers
                   for name in cluster.names_on(broker, prefix, 2))
    with Client(cluster.brokers[0].address) as client:
        for index, name in enumerate(names):
            client.publish(name, b"x" * (index + 1))
    for via in cluster.brokers:
        with Client(via.address) as client:
            assert [s.name for s in client.list_streams(prefix=prefix)] == names
            assert [s.name for s in client.list_streams(pattern=f"{prefix}-*")] == names
            assert client.end_offsets(pattern=f"{prefix}*") == {n: (0, 1) for n in names}
            assert sorted(s.info.name for s in client.stream_stats(f"{prefix}*").streams) \
                == names
            assert client.end_offsets(names[::2]) == {n: (0, 1) for n in names[::2]}
            with pytest.raises(StreamNotFound):
                client.end_offsets([names[0], f"{prefix}-missing"])
    # Pages of two continue across members: a token is only the last name.
    pages: list[list[str]] = []
    token = ""
    with grpc.insecure_channel(cluster.brokers[2].address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        while True:
            reply = stub.ListStreams(pb.ListStreamsRequest(prefix=prefix, page_size=2,
                                                           page_token=token), timeout=10)
            pages.append([info.name for info in reply.streams])
            token = reply.next_page_token
            if not token:
                break
    assert [name for page in pages for name in page] == names
    assert [len(page) for page in pages] == [2, 2, 2]


def test_a_member_down_makes_its_streams_unavailable_not_the_others(cluster, prefix):
    down, up = cluster.brokers[2], cluster.brokers[0]
    (on_down,) = cluster.names_on(down, prefix)
    (on_up,) = cluster.names_on(up, f"{prefix}-up")
    with Client(up.address) as client:
        client.publish(on_down, b"1")
        client.publish(on_up, b"1")
    down.stop()
    with Client(cluster.brokers[1].address, retry_deadline=0.5) as client:
        assert client.publish(on_up, b"2").offset == 1  # held by a member that is up
        with pytest.raises(BrokerUnavailable):
            client.publish(on_down, b"2")
        with pytest.raises(BrokerUnavailable) as listing:
            client.list_streams(prefix=prefix)
        assert listing.value.reason == pb.ERROR_REASON_MEMBER_UNAVAILABLE
        assert down.address in str(listing.value)
    down.start()
    with Client(cluster.brokers[1].address) as client:
        assert client.publish(on_down, b"2").offset == 1


# ---------------------------------------------------------------- the sink, per broker


def two_members(cluster: Cluster) -> tuple[BrokerProcess, BrokerProcess]:
    """Two members in the order a sink commits on them (by address)."""
    first, second = sorted(cluster.brokers[1:], key=lambda b: b.address)
    return first, second


def batch_rows(x: str, y: str, batch: int) -> pa.Table:
    """Rows for two streams in one table, routed by its ``stream`` column."""
    targets = [x] * 5 + [y] * 7
    return pa.table({"value": [f"{batch}-{i}".encode() for i in range(12)],
                     "id": [f"{batch}-{i}" for i in range(12)],
                     "stream": targets})


def test_a_batch_over_two_members_is_exactly_once_after_the_driver_dies_between_commits(
        cluster, prefix):
    first, second = two_members(cluster)
    (x,) = cluster.names_on(first, f"{prefix}-x")
    (y,) = cluster.names_on(second, f"{prefix}-y")
    sink_id = f"{prefix}-sink"
    with Client(cluster.brokers[0].address) as client:  # neither member holds x or y
        sink = client.sink()
        staged = sink.stage(sink_id, 0, "0-0-0", None, batch_rows(x, y, 0))
        assert staged.rows == 12 and sorted(staged.brokers) == [first.address, second.address]
        # The driver commits on the first member, then dies before the second.
        assert sink.commit(sink_id, 0, ["0-0-0"], broker=first.address).written == {x: (0, 5)}
        assert sink.last_batch_id(sink_id, broker=second.address) == -1
    with Client(cluster.brokers[0].address) as client:  # the restarted query replays batch 0
        sink = client.sink()
        staged = sink.stage(sink_id, 0, "0-0-1", None, batch_rows(x, y, 0))
        result = sink.commit_all(sink_id, 0, {b: ["0-0-1"] for b in staged.brokers})
        assert result.brokers == {first.address: True, second.address: False}
        assert result.written == {y: (0, 7)}
        assert read_ids(client, x) == [f"0-{i}" for i in range(5)]
        assert read_ids(client, y) == [f"0-{i}" for i in range(5, 12)]
        # Each member keeps its own commit record; the entry member has none.
        assert [sink.last_batch_id(sink_id, broker=b.address)
                for b in (first, second, cluster.brokers[0])] == [0, 0, -1]


@pytest.mark.parametrize("fault", ["marker", "append"])
def test_a_member_crashing_in_its_commit_leaves_each_stream_exactly_once(cluster, prefix, fault):
    """The second member dies in its commit (fault hook): its recovery and the replay agree."""
    first, second = two_members(cluster)
    (x,) = cluster.names_on(first, f"{prefix}-x")
    (y,) = cluster.names_on(second, f"{prefix}-y")
    sink_id = f"{prefix}-sink"
    second.extra_env[SINK_FAULT_ENV] = fault
    second.restart()
    with Client(cluster.brokers[0].address, retry_deadline=0.5) as client:
        sink = client.sink()
        staged = sink.stage(sink_id, 0, "0-0-0", None, batch_rows(x, y, 0))
        with pytest.raises(BrokerUnavailable):
            sink.commit_all(sink_id, 0, {b: ["0-0-0"] for b in staged.brokers})
    assert second.proc is not None and second.proc.wait(10) == FAULT_EXIT_CODE
    del second.extra_env[SINK_FAULT_ENV]
    second.start()  # recovery rolls the interrupted commit forward before serving
    with Client(cluster.brokers[0].address) as client:  # the replay
        sink = client.sink()
        staged = sink.stage(sink_id, 0, "0-0-1", None, batch_rows(x, y, 0))
        result = sink.commit_all(sink_id, 0, {b: ["0-0-1"] for b in staged.brokers})
        assert result.already_committed and result.written == {}
        assert read_ids(client, x) == [f"0-{i}" for i in range(5)]
        assert read_ids(client, y) == [f"0-{i}" for i in range(5, 12)]
        staged = sink.stage(sink_id, 1, "1-0-0", None, batch_rows(x, y, 1))  # and on it goes
        assert sink.commit_all(sink_id, 1, {b: ["1-0-0"] for b in staged.brokers}).written \
            == {x: (5, 10), y: (7, 14)}


# ---------------------------------------------------------------- Spark


def restart_when_it_exits(broker: BrokerProcess) -> threading.Thread:
    """Wait (in the background) for ``broker`` to die at its fault, then start it clean."""
    def watch() -> None:
        assert broker.proc is not None
        assert broker.proc.wait(120) == FAULT_EXIT_CODE
        del broker.extra_env[SINK_FAULT_ENV]
        broker.start()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.spark
def test_spark_reads_a_pattern_across_members_and_writes_exactly_once_to_two(
        cluster, prefix, spark, tmp_path):
    """One query: streamPattern over sources on two members, rows routed to targets on two.

    The second member to commit dies in its commit of the first batch (the fault hook)
    and comes back; the query's commit is retried, or the query fails and is rerun: either
    way each target holds each source row once, and later input follows.
    """
    from npstream.spark import register

    register(spark)
    first, second = two_members(cluster)
    (src_a,) = cluster.names_on(first, f"{prefix}-src")
    (src_b,) = cluster.names_on(second, f"{prefix}-src")
    (dst_a,) = cluster.names_on(first, f"{prefix}-dst")
    (dst_b,) = cluster.names_on(second, f"{prefix}-dst")
    with Client(cluster.brokers[0].address) as client:
        for source in (src_a, src_b):
            client.publish_batch(source, [{"value": f"{source}:{i}".encode(),
                                           "id": f"{source}:{i}"} for i in range(30)])
    checkpoint = tmp_path / "checkpoint"

    def run() -> object:
        frame = (spark.readStream.format("npstream")
                 .option("broker", cluster.brokers[0].address)
                 .option("streamPattern", f"{prefix}-src-*")
                 .option("startingOffsets", "earliest").load()
                 .selectExpr("id", "value",
                             f"IF(stream = '{src_a}', '{dst_a}', '{dst_b}') AS stream"))
        query = (frame.writeStream.format("npstream").option("broker", cluster.brokers[2].address)
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
                 .start())
        query.awaitTermination(180)
        return query

    second.extra_env[SINK_FAULT_ENV] = "marker"
    second.restart()
    watcher = restart_when_it_exits(second)
    query = run()
    watcher.join(60)
    assert SINK_FAULT_ENV not in second.extra_env  # it did die in its commit
    if query.exception() is not None:  # type: ignore[attr-defined]
        query = run()  # replays the batch: both members have it committed
    assert query.exception() is None  # type: ignore[attr-defined]
    with Client(cluster.brokers[1].address) as client:
        assert sorted(read_ids(client, dst_a)) == sorted(f"{src_a}:{i}" for i in range(30))
        assert sorted(read_ids(client, dst_b)) == sorted(f"{src_b}:{i}" for i in range(30))
        assert dst_a in held(first) and dst_b in held(second)
        for source in (src_a, src_b):  # more input: the query carries on from there
            client.publish_batch(source, [{"value": b"late", "id": f"{source}:late"}])
    assert run().exception() is None  # type: ignore[attr-defined]
    with Client(cluster.brokers[1].address) as client:
        for source, target in ((src_a, dst_a), (src_b, dst_b)):
            ids = read_ids(client, target)
            assert len(ids) == len(set(ids)) == 31 and f"{source}:late" in ids


# ---------------------------------------------------------------- TLS between members


def test_members_call_each_other_over_mutual_tls_with_the_callers_token(
        tmp_path, prefix, tls_files):
    """With client certificates required, members present their own to each other, and
    forward the caller's token (every member knows the same tokens)."""
    brokers: list[BrokerProcess] = []
    try:
        brokers = start_members(tmp_path, ["a", "b"], env={
            **tls_files.broker_env, "NPSTREAM_AUTH_TOKEN": "s3cret",
            "NPSTREAM_PEER_CA_FILE": str(tls_files.ca)})
        cluster = Cluster(brokers)
        (far,) = cluster.names_on(brokers[1], prefix)
        with Client(brokers[0].address, "s3cret", root_certificates=tls_files.ca.read_bytes(),
                    client_cert=tls_files.client_cert.read_bytes(),
                    client_key=tls_files.client_key.read_bytes()) as client:
            client.publish(far, b"over tls", id="t0")  # placed by asking the other member
            assert client.broker_of(far) == brokers[1].address
            assert [s.name for s in client.list_streams(prefix=prefix)] == [far]
            assert read_ids(client, far) == ["t0"]
    finally:
        for broker in brokers:
            broker.stop()

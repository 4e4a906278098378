"""Clusters of real broker processes on loopback, shared by the cluster e2e tests.

Members register in the session's etcd (harness.shared_etcd), each cluster
under a name of its own. Their ports are picked free first so that tests can
compute placement before the members start. ``tests/e2e/broker_cluster/conftest.py``
builds its module-scoped ``cluster_members`` fixture from ``start_members``;
tests that need a cluster of their own (auth on, a member added later) call it
directly.
"""

from __future__ import annotations

import itertools
import json
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
import pyarrow as pa

from harness import BrokerProcess, shared_etcd
from npstream import Client, NpstreamError
from npstream.broker.cluster.etcd.client import EtcdClient
from npstream.broker.cluster.placement import rendezvous_owner
from npstream.proto import metadata_keys, pb, pb_grpc
from npstream.proto.schema import MESSAGE_SCHEMA

__all__ = ["LOCAL", "cluster_of", "etcd_members", "free_ports", "held", "members_of",
           "move_raw", "names_on", "read_ids", "start_members", "stop_members", "wait_until"]

# What members send each other: answer from your own streams, ask no further.
LOCAL = ((metadata_keys.CLUSTER_LOCAL, "1"),)


def free_ports(count: int) -> list[int]:
    """Ports free now (the members must know each other's before any starts)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def start_members(root: Path, names: Sequence[str], *, ports: Sequence[int] | None = None,
                  cluster_name: str | None = None, args: Sequence[str] = (),
                  env: Mapping[str, str] | None = None) -> list[BrokerProcess]:
    """Start one broker per name (data dir ``root/<name>``) as members of one cluster.

    ``ports``: theirs (default: free ones); ``cluster_name``: the cluster to join
    (default: a new one; ``cluster_of(broker)`` names a running one, to add a
    member); ``args``/``env``: extra broker flags and environment, the same for each.
    Returns once every member's view lists them all.
    """
    ports = list(ports) if ports is not None else free_ports(len(names))
    cluster_name = cluster_name or f"c{uuid.uuid4().hex[:12]}"
    etcd = shared_etcd()
    brokers: list[BrokerProcess] = []
    try:
        for name, port in zip(names, ports, strict=True):
            broker = BrokerProcess(root / name, env=dict(env or {}), args=[
                "--etcd", etcd.endpoint, "--cluster-name", cluster_name,  # type: ignore[attr-defined]
                *args])
            broker.port = port
            brokers.append(broker.start())
        wait_until(lambda: {b.address for b in brokers} <= set(etcd_members(cluster_name)),
                   timeout=30)
        time.sleep(0.3)  # every member's watch of the members sees them (milliseconds)
    except BaseException:
        stop_members(brokers)
        raise
    return brokers


def cluster_of(broker: BrokerProcess) -> str:
    """The cluster name a broker of start_members joined."""
    return broker.extra_args[broker.extra_args.index("--cluster-name") + 1]


def etcd_members(cluster_name: str) -> list[str]:
    """The addresses etcd lists as the cluster's members now."""
    client = EtcdClient(shared_etcd().endpoint)  # type: ignore[attr-defined]
    try:
        items, _revision = client.get_prefix(f"/npstream/{cluster_name}/members/")
    finally:
        client.close()
    return [json.loads(kv.value)["address"] for kv in items]


def members_of(broker: BrokerProcess) -> list[str]:
    """The members a broker's view lists now (ClusterService.Owners)."""
    with grpc.insecure_channel(broker.address) as channel:
        reply = pb_grpc.ClusterServiceStub(channel).Owners(pb.OwnersRequest(), timeout=10)
    return list(reply.members)


def stop_members(brokers: Sequence[BrokerProcess]) -> None:
    for broker in brokers:
        broker.stop()


def names_on(member: str, members: Sequence[str], prefix: str, count: int = 1) -> list[str]:
    """``count`` names of the form prefix-N that placement puts on ``member``."""
    candidates = (f"{prefix}-{i}" for i in itertools.count())
    return list(itertools.islice(
        (name for name in candidates if rendezvous_owner(name, list(members)) == member),
        count))


def held(broker: BrokerProcess, token: str | None = None) -> set[str]:
    """The streams this member holds itself (its registry, as members ask each other)."""
    metadata = LOCAL if token is None else (*LOCAL, ("authorization", f"Bearer {token}"))
    with grpc.insecure_channel(broker.address) as channel:
        reply = pb_grpc.StreamServiceStub(channel).ListStreams(
            pb.ListStreamsRequest(page_size=10_000), metadata=metadata, timeout=10)
    return {info.name for info in reply.streams}


def read_ids(client: Client, stream: str) -> list[str]:
    """Every retained message id of ``stream``, in offset order."""
    info = client.stream_info(stream)
    batches = list(client.read_range(stream, info.start_offset, info.end_offset))
    return pa.Table.from_batches(batches, schema=MESSAGE_SCHEMA).column("id").to_pylist()


def wait_until(predicate: object, timeout: float = 60.0) -> None:
    """Poll ``predicate`` (a member may be restarting: its errors count as False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():  # type: ignore[operator]
                return
        except (grpc.RpcError, NpstreamError):
            pass
        time.sleep(0.2)
    raise AssertionError("timed out")


def move_raw(broker: BrokerProcess, stream: str, to: str,
             token: str | None = None) -> grpc.StatusCode:
    """MoveStream sent once, without the SDK's retries: OK or the status it ended with."""
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(broker.address) as channel:
        try:
            pb_grpc.ClusterServiceStub(channel).MoveStream(
                pb.MoveStreamRequest(stream=stream, to=to), timeout=60, metadata=metadata)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK

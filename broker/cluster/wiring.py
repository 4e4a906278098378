"""Building a member's cluster view from its configuration, joining etcd, and the interceptor."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import grpc

from npstream.broker.auth.access import AccessControl
from npstream.broker.cluster.errors import EtcdError
from npstream.broker.cluster.etcd.client import EtcdClient
from npstream.broker.cluster.interceptor import RoutingInterceptor
from npstream.broker.cluster.membership import Membership, new_record
from npstream.broker.cluster.peers import Peers
from npstream.broker.cluster.router import Cluster
from npstream.broker.cluster.stream_records import StreamRecords
from npstream.broker.server.config import BrokerConfig

__all__ = ["build_cluster", "join_cluster", "routing_interceptors"]

log = logging.getLogger(__name__)


def build_cluster(config: BrokerConfig, holds: Callable[[str], bool],
                  access: AccessControl) -> Cluster:
    """The cluster of ``[cluster] etcd`` (its view attached by ``join_cluster``); a
    cluster of one without etcd.

    ``holds(name)``: whether this member holds the stream (its registry).
    """
    if not config.cluster.coordinated:
        return Cluster.single(holds, access)
    server, cluster = config.server, config.cluster
    peers = Peers.from_files(
        [], timeout_s=cluster.peer_timeout_ms / 1000, tls=server.tls_enabled,
        peer_ca_file=cluster.peer_ca_file, cert_file=server.tls_cert_file,
        key_file=server.tls_key_file, present_cert=bool(server.tls_client_ca_file),
        max_message_bytes=server.grpc_max_message_bytes)
    return Cluster("", holds, access, peers, cluster.cluster_token, enabled=True)


def join_cluster(config: BrokerConfig, cluster: Cluster, address: str, data_dir: Path,
                 local_streams: Callable[[], list[str]]) -> Membership:
    """Register this member in etcd and attach the view to ``cluster`` (EtcdError).

    Streams held here without an etcd record (made before this member joined, or
    while etcd was away) get one naming this member.
    """
    settings = config.cluster
    client = EtcdClient(settings.etcd, timeout_s=settings.peer_timeout_ms / 1000)
    membership = Membership(client, settings.cluster_name,
                            new_record(data_dir, address, settings.rack),
                            settings.member_lease_ms // 1000)
    try:
        membership.start()
        records = StreamRecords(client, settings.cluster_name)
        recorded = records.names()
        missing = [name for name in local_streams() if name not in recorded]
        if missing:
            conflicts = records.create(missing, membership.record.id)
            log.info("recorded %d stream(s) held here in etcd", len(missing) - len(conflicts))
            for name in conflicts:
                log.warning("stream '%s' is held here but etcd records it on another member: "
                            "it is served here while this member holds it; move or delete "
                            "one of the two copies", name)
    except EtcdError:
        membership.stop()
        raise
    cluster.attach(address, membership, records)
    return membership


def routing_interceptors(cluster: Cluster) -> list[grpc.ServerInterceptor]:
    """The routing interceptor of a member; none for a cluster of one (nothing to route)."""
    return [RoutingInterceptor(cluster)] if cluster.enabled else []

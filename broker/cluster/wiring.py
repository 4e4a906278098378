"""Building a member's cluster view from its configuration, and the interceptor it serves with."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from npstream.broker.auth.access import AccessControl
from npstream.broker.cluster.interceptor import RoutingInterceptor
from npstream.broker.cluster.peers import Peers
from npstream.broker.cluster.router import Cluster
from npstream.broker.server.config import BrokerConfig

__all__ = ["build_cluster", "routing_interceptors"]


def build_cluster(config: BrokerConfig, holds: Callable[[str], bool],
                  access: AccessControl) -> Cluster:
    """The cluster of ``[cluster]``; a cluster of one without members.

    ``holds(name)``: whether this member holds the stream (its registry).
    """
    if not config.cluster.enabled:
        return Cluster.single(holds, access)
    server, cluster = config.server, config.cluster
    identity = config.cluster_identity
    peers = Peers.from_files(
        [member for member in cluster.members if member != identity],
        timeout_s=cluster.peer_timeout_ms / 1000, tls=server.tls_enabled,
        peer_ca_file=cluster.peer_ca_file, cert_file=server.tls_cert_file,
        key_file=server.tls_key_file, present_cert=bool(server.tls_client_ca_file),
        max_message_bytes=server.grpc_max_message_bytes)
    return Cluster(identity, cluster.members, holds, access, peers, cluster.cluster_token)


def routing_interceptors(cluster: Cluster) -> list[grpc.ServerInterceptor]:
    """The routing interceptor of a member; none for a cluster of one (nothing to route)."""
    return [RoutingInterceptor(cluster)] if cluster.enabled else []

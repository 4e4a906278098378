"""The member's identity and its moves, as Prometheus series computed when scraped.

Each member serves its own ``/metrics``, with its own streams' series, so a
dashboard over a cluster scrapes every member; ``npstream_cluster_member_info``
says which member a scrape came from (and how many members there are)
whatever address Prometheus used, so series can be grouped by member
(``* on (instance) group_left (member) npstream_cluster_member_info``). A
broker without a cluster reports ``member=""`` and one member.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from npstream.broker.cluster.move_state import MoveBook
    from npstream.broker.cluster.router import Cluster

__all__ = ["ClusterCollector"]


class ClusterCollector(Collector):
    """``npstream_cluster_member_info`` and ``npstream_stream_moves_unfinished``."""

    def __init__(self, cluster: Cluster, moves: MoveBook) -> None:
        self._cluster = cluster
        self._moves = moves

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "npstream_cluster_member_info",
            "This broker's advertised address in its cluster (always 1; member is '' "
            "without a cluster) and how many members the cluster has",
            labels=["member", "members"])
        info.add_metric([self._cluster.identity, str(max(len(self._cluster.members), 1))], 1)
        yield info
        moves = GaugeMetricFamily(
            "npstream_stream_moves_unfinished",
            "Streams this member is moving away whose move is not done (paused or redirecting)",
            labels=["state"])
        counts = {"copying": 0, "switching": 0, "removing": 0}
        for record in self._moves.unfinished():
            counts[record.state] = counts.get(record.state, 0) + 1
        for state, count in counts.items():
            moves.add_metric([state], count)
        yield moves

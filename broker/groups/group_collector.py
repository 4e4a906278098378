"""Per-group Prometheus series, computed when scraped: position, lag, leases, members.

Every group of every stream, cursor and shared alike (a Spark query that
names a ``group`` option commits its progress to a cursor group, so it shows
up here too): the committed offset, the lag in messages (``end_offset -
committed``) and in seconds (the age of the oldest unconsumed message: the
one at the committed offset), in-flight leases and unfinished deliveries,
members listed and connected, and the group's own counters since start
(deliveries, redeliveries, acks, nacks, dead letters, pulled). The dead
letters total is the group's persistent count.

Only while at most ``metrics_group_gauges_max`` groups exist: each group
costs a dozen series and a lookup of its oldest message's time. Above the
cap only ``npstream_groups`` and the broker-wide counters remain.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from npstream.broker.errors import BrokerError

if TYPE_CHECKING:
    from npstream.broker.groups.manager import GroupManager, GroupStatus

__all__ = ["GroupCollector", "connected_members", "lag_seconds"]

log = logging.getLogger(__name__)


def connected_members(status: GroupStatus) -> int:
    """Members with at least one open Subscribe call (the snapshot counts them)."""
    return sum(1 for member in status.members if getattr(member, "connections", 0) > 0)


def lag_seconds(oldest_unconsumed_ms: int, now_ms: float) -> float:
    """The age of the oldest unconsumed message; 0 when the group is caught up."""
    if oldest_unconsumed_ms <= 0:
        return 0.0
    return max(0.0, (now_ms - oldest_unconsumed_ms) / 1000)


class GroupCollector(Collector):
    """The groups' series; registered on the broker's registry by the GroupManager."""

    def __init__(self, manager: GroupManager, gauges_max: int,
                 clock: Callable[[], float] = time.time) -> None:
        self._manager = manager
        self._gauges_max = gauges_max
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        try:
            total = self._manager.count()
            yield GaugeMetricFamily("npstream_groups", "Consumer groups of all streams",
                                    value=total)
            if total > self._gauges_max:  # counted without loading a group
                return
            statuses = self._manager.statuses()
        except BrokerError as exc:  # shutting down
            log.debug("no group metrics: %s", exc)
            return
        labels = ["stream", "group"]

        def gauge(name: str, text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"npstream_group_{name}", text, labels=labels)

        def counter(name: str, text: str) -> CounterMetricFamily:
            return CounterMetricFamily(f"npstream_group_{name}", text, labels=labels)

        gauges = {
            "committed": gauge("committed_offset",
                               "Next offset the group reads (shared: lowest not yet acked)"),
            "lag": gauge("lag_messages", "Messages between the committed offset and the end"),
            "lag_s": gauge("lag_seconds",
                           "Age of the oldest unconsumed message (0 when caught up)"),
            "in_flight": gauge("in_flight_leases", "Leased, unsettled deliveries (shared)"),
            "members": gauge("members", "Members listed (shared groups)"),
            "connected": gauge("members_connected",
                               "Members with an open subscription (shared groups)"),
        }
        counters = {
            "delivered": counter("delivered_messages",
                                 "Shared-group deliveries since start, redeliveries included"),
            "redelivered": counter("redelivered_messages",
                                   "Shared-group deliveries with attempt > 1 since start"),
            "acked": counter("acked_messages", "Leases acked since start"),
            "nacked": counter("nacked_messages", "Leases nacked since start"),
            "pulled": counter("pulled_messages", "Messages returned by Pull since start"),
            "dead": counter("dead_lettered_messages",
                            "Messages copied to the dead-letter stream (kept across restarts)"),
        }
        now_ms = self._clock() * 1000
        for status in statuses:
            key = [status.stream, status.group]
            tally = self._manager.metrics.tally(status.stream, status.group)
            values = {
                "committed": status.committed_offset, "lag": status.lag,
                "lag_s": lag_seconds(self._manager.oldest_unconsumed_ms(status), now_ms),
                "in_flight": status.in_flight, "members": len(status.members),
                "connected": connected_members(status),
            }
            for name, family in gauges.items():
                family.add_metric(key, values[name])
            counts = {"delivered": tally.delivered, "redelivered": tally.redelivered,
                      "acked": tally.acked, "nacked": tally.nacked, "pulled": tally.pulled,
                      "dead": max(status.dead_lettered, tally.dead_lettered)}
            for name, counter_family in counters.items():
                counter_family.add_metric(key, counts[name])
        yield from gauges.values()
        yield from counters.values()

    def describe(self) -> list[Metric]:
        return []

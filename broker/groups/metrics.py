"""Prometheus counters of consumer groups, on the broker's metrics registry.

Like the broker's other counters they carry no stream or group label, so
their cost does not grow with the number of groups; per-group numbers are
what DescribeGroup / `npstream groups describe` report.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

__all__ = ["GroupMetrics"]


class GroupMetrics:
    """Counters updated by shared and cursor groups (registry None: not exported)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry
        self.deliveries = Counter("npstream_group_deliveries",
                                  "Shared-group deliveries (leases handed out), redeliveries "
                                  "included", registry=r)
        self.redeliveries = Counter("npstream_group_redeliveries",
                                    "Shared-group deliveries with attempt > 1", registry=r)
        self.acks = Counter("npstream_group_acks", "Shared-group leases acked", registry=r)
        self.nacks = Counter("npstream_group_nacks", "Shared-group leases nacked", registry=r)
        self.dead_letters = Counter("npstream_group_dead_letters",
                                    "Messages copied to a dead-letter stream", registry=r)
        self.subscribe_messages = Counter(
            "npstream_group_subscribe_messages",
            "Stream messages sent on Subscribe calls (a DeliveryBatch counts once; "
            "deliveries_total / this = mean batch size)", registry=r)
        self.subscribe_requests = Counter(
            "npstream_group_subscribe_requests",
            "SubscribeRequests received (each carries coalesced acks, nacks and credits)",
            registry=r)
        self.pulled = Counter("npstream_group_pulled_messages",
                              "Messages returned by cursor-group Pull", registry=r)

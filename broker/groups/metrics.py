"""Prometheus counters of consumer groups, and each group's own tally of them.

The counters carry no stream or group label, so updating them costs the
same with ten groups or ten thousand. Each loaded group also keeps its own
tally (deliveries, redeliveries, acks, nacks, dead letters, pulled messages)
through a view of these counters (``for_group``): the group objects
increment ``metrics.deliveries`` like any counter, and the view adds the count to
the broker-wide counter and to that group's tally. The tallies are exported
per group by group_collector.py (capped, at scrape time) and feed the
streams' "messages out" (``count_out``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

__all__ = ["CounterLike", "GroupMetrics", "GroupTally"]


class CounterLike(Protocol):
    """What the group objects call on a metric: ``inc``."""

    def inc(self, amount: float = 1) -> None: ...


@dataclass
class GroupTally:
    """One group's counts since the broker loaded it (deleting the group drops them)."""

    delivered: int = 0      # shared-group deliveries, redeliveries included
    redelivered: int = 0
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0  # copied to the dead-letter stream since start
    pulled: int = 0         # cursor-group Pull


class _Tee:
    """A counter view: ``inc`` adds to the broker-wide counter and to one group's tally."""

    __slots__ = ("_add", "_total")

    def __init__(self, total: CounterLike, add: Callable[[int], None]) -> None:
        self._total = total
        self._add = add

    def inc(self, amount: float = 1) -> None:
        self._total.inc(amount)
        self._add(int(amount))


class GroupMetrics:
    """Counters updated by shared and cursor groups (registry None: not exported)."""

    deliveries: CounterLike
    redeliveries: CounterLike
    acks: CounterLike
    nacks: CounterLike
    dead_letters: CounterLike

    def __init__(self, registry: CollectorRegistry | None = None,
                 count_out: Callable[[str, int], None] | None = None) -> None:
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
        self._count_out = count_out
        self._lock = threading.Lock()
        self._tallies: dict[tuple[str, str], GroupTally] = {}

    # ------------------------------------------------------------ per group

    def for_group(self, stream: str, group: str) -> GroupMetrics:
        """The metrics a group object is given: these counters, teed into its own tally."""
        return _GroupView(self, stream, group)

    def _add(self, stream: str, group: str, field: str, amount: int) -> None:
        with self._lock:
            tally = self._tallies.get((stream, group))
            if tally is None:
                tally = self._tallies[(stream, group)] = GroupTally()
            setattr(tally, field, getattr(tally, field) + amount)
        if field in ("delivered", "pulled") and self._count_out is not None:
            self._count_out(stream, amount)

    def count_pulled(self, stream: str, group: str, count: int) -> None:
        """A cursor group's Pull returned ``count`` messages (its tally; the total is the
        service's ``pulled`` counter)."""
        self._add(stream, group, "pulled", count)

    def tally(self, stream: str, group: str) -> GroupTally:
        """A copy of the group's tally (zeros when it has none)."""
        with self._lock:
            found = self._tallies.get((stream, group))
            return GroupTally() if found is None else GroupTally(**vars(found))

    def forget(self, stream: str, group: str | None = None) -> None:
        """Drop the tally of a deleted group (``group`` None: every group of the stream)."""
        with self._lock:
            for key in [k for k in self._tallies
                        if k[0] == stream and (group is None or k[1] == group)]:
                del self._tallies[key]


class _GroupView(GroupMetrics):
    """GroupMetrics as one group sees it (no new counters are registered)."""

    def __init__(self, parent: GroupMetrics, stream: str, group: str) -> None:
        # Deliberately not GroupMetrics.__init__: that would create new counters.
        def tee(total: CounterLike, field: str) -> _Tee:
            return _Tee(total, lambda n: parent._add(stream, group, field, n))

        self.deliveries = tee(parent.deliveries, "delivered")
        self.redeliveries = tee(parent.redeliveries, "redelivered")
        self.acks = tee(parent.acks, "acked")
        self.nacks = tee(parent.nacks, "nacked")
        self.dead_letters = tee(parent.dead_letters, "dead_lettered")
        self.subscribe_messages = parent.subscribe_messages
        self.subscribe_requests = parent.subscribe_requests
        self.pulled = parent.pulled
        self._count_out = parent._count_out
        self._lock = parent._lock
        self._tallies = parent._tallies

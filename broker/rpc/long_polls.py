"""Long polls park a worker thread each: how many may park at once.

gRPC's sync server runs every call on a thread of its pool (``max_workers``,
default 4,096), and a long poll (a Fetch with ``wait_ms`` at the end of its
stream) holds its thread while it waits. Past ``max_workers`` parked polls,
further calls queue for a thread with every publish behind them
(DEADLINE_EXCEEDED), and polls whose client gives up in the queue end
CANCELLED unserved (docs/benchmarks.md has the figures).

``ParkedPolls`` lets at most ``limit`` polls park at once (the broker uses
half its worker threads, so the other half always serve everything else);
a poll past it is answered at once with what is there, as it would be when
its wait ends, so none queues for a thread. The waiting itself
(streams/service.py) sleeps until data, the call's end or its deadline, and
looks for a stopping broker every few seconds only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["ParkedPolls"]


class ParkedPolls:
    """How many long polls wait now, within ``limit`` (0: no limit). Thread-safe."""

    def __init__(self, limit: int, registry: CollectorRegistry | None = None) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._parked = 0
        self._events: set[threading.Event] = set()
        self._gauge: Gauge | None = None
        self._unparked: Counter | None = None
        if registry is not None:
            self._gauge = Gauge("npstream_parked_long_polls",
                                "Long polls (Fetch with wait_ms) waiting for data now, each "
                                "holding a worker thread", registry=registry)
            self._unparked = Counter(
                "npstream_long_polls_answered_at_once",
                "Long polls answered without waiting because max_parked_polls were "
                "waiting already", registry=registry)

    @property
    def parked(self) -> int:
        return self._parked

    def _add(self, delta: int) -> None:
        self._parked += delta
        if self._gauge is not None:
            self._gauge.set(self._parked)

    @contextmanager
    def park(self) -> Iterator[threading.Event | None]:
        """For the duration of the block, the event that wakes the poll (its waker sets
        it; ``wake_all`` too), or None when the poll must not wait."""
        woken = threading.Event()
        with self._lock:
            allowed = not self.limit or self._parked < self.limit
            if allowed:
                self._add(1)
                self._events.add(woken)
            elif self._unparked is not None:
                self._unparked.inc()
        try:
            yield woken if allowed else None
        finally:
            if allowed:
                with self._lock:
                    self._add(-1)
                    self._events.discard(woken)

    def wake_all(self) -> None:
        """Wake every parked poll (the broker is stopping: they answer at once)."""
        with self._lock:
            for woken in self._events:
                woken.set()

"""The publish memory budget: how many bytes of publish data the broker holds at once.

A publish request is in the broker's memory from the moment gRPC has read it
until its rows are written: the wire bytes, the Arrow table decoded from them
(mostly views of those bytes) and the stored batch built from that. Without a
bound, a flood of large publishes from many clients grows the broker's
memory with the number of requests in flight until the kernel's OOM killer
ends it. ``PublishBudget`` bounds the sum of the wire sizes of the publish
requests (Publish, each PublishStream request, Stage) being decoded and
written to ``max_publish_bytes_in_flight`` (broker.toml, ``[server]``):

* a unary call (Publish, Stage) that does not fit waits briefly
  (``UNARY_WAIT_S``) for others to finish, then is refused with
  RESOURCE_EXHAUSTED, reason OVERLOADED, and a retry hint
  (``x-npstream-retry-after-ms``); nothing of it was stored, so any client
  may send it again, and the SDK does, with backoff;
* a PublishStream request waits until it fits: its reader stops reading the
  call, so gRPC flow control holds the client back (the client pipelines a
  few requests, and they are answered in order anyway).

A request larger than the whole budget is admitted when nothing else is in
flight, so that it is slowed down, never refused for good. What the budget
cannot bound is gRPC's own buffering: a unary request is read whole before
the broker sees it, so at most ``max_workers`` requests (each up to
``grpc_max_message_bytes``) are in memory while waiting for admission or
being refused; docs/broker.md ("Overload") states the resulting bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge

from npstream.broker.errors import OverloadedError, ShuttingDownError

__all__ = ["RETRY_AFTER_MS", "UNARY_WAIT_S", "PublishBudget"]

# ---------------------------------------------------------------- tuning
# How long a unary publish waits for room before it is refused: long enough to
# ride out the write of the requests ahead of it (a few ms each), short enough
# that a refused client is told quickly and the worker thread is freed.
UNARY_WAIT_S = 0.1
# The delay a refused client is asked to wait before sending again: about the
# time the broker needs to write a few requests' worth of the budget.
RETRY_AFTER_MS = 100
# A waiting PublishStream request re-checks for shutdown and a vanished client
# this often.
_STREAM_POLL_S = 0.25


class PublishBudget:
    """Admission of publish bytes against ``limit`` (0: no limit). Thread-safe."""

    def __init__(self, limit: int, registry: CollectorRegistry | None = None) -> None:
        self.limit = limit
        self._cond = threading.Condition()
        self._in_flight = 0
        self._in_flight_gauge: Gauge | None = None
        self._refused: Counter | None = None
        if registry is not None:
            self._in_flight_gauge = Gauge(
                "npstream_publish_bytes_in_flight",
                "Wire bytes of publish requests (Publish, PublishStream, Stage) being decoded "
                "and written now (bounded by max_publish_bytes_in_flight)", registry=registry)
            self._refused = Counter(
                "npstream_publish_overloaded",
                "Publish and Stage calls refused with RESOURCE_EXHAUSTED (reason OVERLOADED) "
                "because the publish memory budget was used up", registry=registry)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def _fits_locked(self, nbytes: int) -> bool:
        return self._in_flight == 0 or self._in_flight + nbytes <= self.limit

    def _take_locked(self, nbytes: int) -> None:
        self._in_flight += nbytes
        if self._in_flight_gauge is not None:
            self._in_flight_gauge.set(self._in_flight)

    def release(self, nbytes: int) -> None:
        """Give back what ``acquire`` took (once the request's rows are written or failed)."""
        if not self.limit:
            return
        with self._cond:
            self._in_flight -= nbytes
            if self._in_flight_gauge is not None:
                self._in_flight_gauge.set(self._in_flight)
            self._cond.notify_all()

    def acquire(self, nbytes: int, what: str, *, wait_s: float | None,
                should_stop: Callable[[], bool] = lambda: False) -> None:
        """Count ``nbytes`` in, waiting up to ``wait_s`` (None: until it fits).

        OverloadedError (naming ``what``, e.g. "publish to stream 'orders'")
        when ``wait_s`` passes first; ShuttingDownError when ``should_stop()``
        turns true while waiting without limit (the broker stops, the client left).
        """
        if not self.limit:
            return
        deadline = None if wait_s is None else time.monotonic() + wait_s
        with self._cond:
            while not self._fits_locked(nbytes):
                if deadline is None:
                    if should_stop():
                        raise ShuttingDownError(f"{what}: the call ended while it waited "
                                                "for the publish memory budget")
                    self._cond.wait(_STREAM_POLL_S)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if self._refused is not None:
                        self._refused.inc()
                    raise OverloadedError(
                        f"broker overloaded: {what} ({nbytes} bytes) does not fit the publish "
                        f"memory budget ({self._in_flight} of max_publish_bytes_in_flight="
                        f"{self.limit} bytes in flight); nothing was stored: send it again "
                        f"after {RETRY_AFTER_MS} ms", RETRY_AFTER_MS)
                self._cond.wait(remaining)
            self._take_locked(nbytes)

    @contextmanager
    def admitted(self, nbytes: int, what: str) -> Iterator[None]:
        """A unary call's admission for the duration of the block (see the module docstring)."""
        self.acquire(nbytes, what, wait_s=UNARY_WAIT_S)
        try:
            yield
        finally:
            self.release(nbytes)

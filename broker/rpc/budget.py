"""The publish memory budget: how many bytes of publish data the broker holds at once.

A publish request is in the broker's memory from the moment gRPC starts
reading it until its rows are written: gRPC's receive buffers, the request's
bytes, the Arrow table decoded from them (mostly views of those bytes) and the
stored batch built from that. Without a bound, a flood of large publishes from
many clients grows the broker's memory with the number of requests in flight
until the kernel's OOM killer ends it. ``PublishBudget`` bounds the wire
bytes of the publish requests (Publish, Stage, each PublishStream request)
being read, decoded and written to ``max_publish_bytes_in_flight``
(broker.toml ``[server]``):

* a Publish or Stage call is admitted when it arrives, before gRPC reads its
  request (``PublishAdmission``, a server interceptor): while the bytes in
  flight are at the budget, or while too many admitted calls are still
  unread (``unread_limit``: one per ``UNREAD_CALL_BYTES`` of budget, at
  least ``MIN_UNREAD_CALLS``), it is refused at once with RESOURCE_EXHAUSTED,
  reason OVERLOADED and a retry hint (``x-npstream-retry-after-ms``), without
  its request ever being read into the process. Nothing of it was stored, so
  any client may send it again; the SDK does, with backoff;
* once read, an admitted call counts its request's real size; when that does
  not fit, it waits briefly (``UNARY_WAIT_S``), then is refused the same way;
* a PublishStream request waits until it fits: the call's reader stops
  reading, so gRPC flow control holds the client back (the client pipelines a
  few requests, answered in order anyway);
* a compressed Arrow IPC stream's decoded bytes beyond its wire bytes are
  admitted too, before it is decompressed (arrow_input.py), as a unary call's.

A request larger than the whole budget is admitted when nothing else is in
flight, so that it is slowed down, never refused for good. docs/broker.md
("Overload") states the memory bound this gives and how it was measured.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from npstream.broker.errors import OverloadedError, ShuttingDownError
from npstream.broker.rpc.status import abort_with
from npstream.broker.rpc.tuning import (
    MIN_UNREAD_CALLS,
    RETRY_AFTER_MS,
    STREAM_POLL_S,
    UNARY_WAIT_S,
    UNREAD_CALL_BYTES,
    UNREAD_TTL_S,
)

__all__ = [
    "PublishAdmission",
    "PublishBudget",
]

class PublishBudget:
    """Admission of publish bytes against ``limit`` (0: no limit). Thread-safe."""

    def __init__(self, limit: int, registry: CollectorRegistry | None = None) -> None:
        self.limit = limit
        self.unread_limit = max(MIN_UNREAD_CALLS, limit // UNREAD_CALL_BYTES)
        self._cond = threading.Condition()
        self._in_flight = 0
        self._unread: dict[int, float] = {}  # admitted, not yet read: ticket -> admitted at
        self._tickets = itertools.count(1)
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

    def _fits_locked(self, nbytes: int, held: int = 0) -> bool:
        return (not nbytes or self._in_flight <= held
                or self._in_flight + nbytes <= self.limit)

    def admit_call(self) -> int | None:
        """A ticket for a call about to be read, or None when it must be refused now.

        Never waits (the interceptor runs on gRPC's serving thread). Refused:
        the bytes in flight are at the budget, or ``unread_limit`` admitted
        calls are still unread.
        """
        now = time.monotonic()
        with self._cond:
            if len(self._unread) >= self.unread_limit:
                stale = [t for t, at in self._unread.items() if now - at > UNREAD_TTL_S]
                for ticket in stale:
                    del self._unread[ticket]
            if self._in_flight >= self.limit or len(self._unread) >= self.unread_limit:
                if self._refused is not None:
                    self._refused.inc()
                return None
            ticket = next(self._tickets)
            self._unread[ticket] = now
            return ticket

    def call_read(self, ticket: int) -> None:
        """The admitted call ``ticket`` was read: from now on its bytes count instead."""
        with self._cond:
            self._unread.pop(ticket, None)

    def overloaded(self, what: str, nbytes: int | None = None) -> OverloadedError:
        """The error of a refused request (``nbytes`` None: refused before it was read)."""
        size = f" ({nbytes} bytes)" if nbytes is not None else ""
        return OverloadedError(
            f"broker overloaded: {what}{size} does not fit the publish memory budget "
            f"({self._in_flight} of max_publish_bytes_in_flight={self.limit} bytes in flight, "
            f"{len(self._unread)} call(s) waiting to be read); nothing was stored: send it "
            f"again after {RETRY_AFTER_MS} ms", RETRY_AFTER_MS)

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
                should_stop: Callable[[], bool] = lambda: False, held: int = 0) -> None:
        """Count ``nbytes`` in, waiting up to ``wait_s`` (None: until it fits).

        OverloadedError (naming ``what``, e.g. "publish to stream 'orders'")
        when ``wait_s`` passes first; ShuttingDownError when ``should_stop()``
        turns true while waiting without limit (the broker stops, the client left).
        ``held``: bytes the caller holds already (a request's wire bytes, when
        its decoded bytes are added): with nothing else in flight it fits, as
        a lone request larger than the budget does.
        """
        if not self.limit:
            return
        deadline = None if wait_s is None else time.monotonic() + wait_s
        with self._cond:
            while not self._fits_locked(nbytes, held):
                if deadline is None:
                    if should_stop():
                        raise ShuttingDownError(f"{what}: the call ended while it waited "
                                                "for the publish memory budget")
                    self._cond.wait(STREAM_POLL_S)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if self._refused is not None:
                        self._refused.inc()
                    raise self.overloaded(what, nbytes)
                self._cond.wait(remaining)
            self._take_locked(nbytes)

    @contextmanager
    def admitted(self, nbytes: int, what: str, *, held: int = 0) -> Iterator[None]:
        """A unary call's admission for the duration of the block (see the module docstring)."""
        self.acquire(nbytes, what, wait_s=UNARY_WAIT_S, held=held)
        try:
            yield
        finally:
            self.release(nbytes)


class PublishAdmission(grpc.ServerInterceptor):
    """Admits the unary publish methods against the budget before their requests are read.

    ``methods``: full method paths ("/npstream.v1.StreamService/Publish"),
    registered with raw requests (npstream.broker.rpc.registration), so the
    admitted handler sees the request's wire bytes and counts their size.
    A refused call gets a handler that streams its request: gRPC then never
    reads it, and the call ends with OVERLOADED at once.
    """

    def __init__(self, budget: PublishBudget, methods: Collection[str]) -> None:
        self._budget = budget
        self._methods = frozenset(methods)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        method = handler_call_details.method or ""
        if (handler is None or method not in self._methods or handler.request_streaming
                or handler.unary_unary is None):
            return handler
        name = method.rsplit("/", 1)[-1]
        ticket = self._budget.admit_call()
        if ticket is None:
            return self._refusal(name)
        return self._admitted(handler, name, ticket)

    def _refusal(self, name: str) -> grpc.RpcMethodHandler:
        error = self._budget.overloaded(f"{name} call")

        def refuse(_requests: Iterator[bytes], context: grpc.ServicerContext) -> None:
            abort_with(context, error, name)

        return grpc.stream_unary_rpc_method_handler(refuse)

    def _admitted(self, handler: grpc.RpcMethodHandler, name: str,
                  ticket: int) -> grpc.RpcMethodHandler:
        budget = self._budget
        behaviour = handler.unary_unary
        assert behaviour is not None  # checked by intercept_service

        def admitted(raw: bytes, context: grpc.ServicerContext) -> Any:
            budget.call_read(ticket)
            try:
                budget.acquire(len(raw), f"{name} call", wait_s=UNARY_WAIT_S)
            except OverloadedError as exc:
                abort_with(context, exc, name)
            try:
                return behaviour(raw, context)
            finally:
                budget.release(len(raw))

        return grpc.unary_unary_rpc_method_handler(
            admitted, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)

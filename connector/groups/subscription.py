"""Push subscriptions to a shared group: ``client.subscribe`` and the ``Subscription`` it returns.

A subscription is one long-lived GroupService call that the broker pushes
deliveries down, within the credits the subscription grants (at most
``max_in_flight`` unfinished deliveries). This module is its life cycle: the
handshake that makes ``subscribe()`` return only once the member is in the
group, reconnecting with backoff when the broker goes away (a subscription
survives a broker restart without the application noticing), and a ``stop()``
that lets running handlers finish. What it sends back is coalesced by
``npstream.groups.outbox``; its handler threads are ``npstream.groups.dispatcher``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from npstream.client import group_rpc
from npstream.errors import BrokerUnavailable, InvalidArgument, NpstreamError
from npstream.groups.dispatcher import Dispatcher, Feed
from npstream.groups.leases import (
    LEASE_INDEX,
    LEASE_OFFSET,
    LEASE_STATES,
    Lease,
    check_group,
    default_member_id,
    shared_group_config,
    unary_settler,
)
from npstream.groups.options import GroupOptions, group_options
from npstream.groups.outbox import CREDIT_BATCH_DIVISOR, Outbox
from npstream.proto import metadata_keys, pb

if TYPE_CHECKING:
    from npstream.client.client import Client

__all__ = ["Subscription", "SubscriptionCounters", "SubscriptionStats", "subscribe"]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- tuning
# Reconnect backoff of a subscription after the broker became unreachable:
# first wait, growth factor and cap (seconds). A restarted local broker is
# back within a second or two.
RECONNECT_INITIAL_S = 0.1
RECONNECT_MULTIPLIER = 2.0
RECONNECT_MAX_S = 2.0
# How long stop() waits for running handlers by default (seconds).
STOP_TIMEOUT_S = 30.0
# How long subscribe() keeps trying to reach an unreachable broker before it
# raises BrokerUnavailable (the client's default retry_deadline).
FIRST_CONNECT_DEADLINE_S = 15.0

_member_numbers = itertools.count(1)


def subscribe(
    client: Client,
    stream: str,
    group: str,
    handler: Callable[[Lease], object],
    *,
    max_in_flight: int = 1000,
    options: GroupOptions | None = None,
    **keywords: Any,
) -> Subscription:
    """Start a push subscription; see ``npstream.groups.shared`` for the model.

    Returns once the broker has accepted it (the member is in the group), so
    a missing stream or invalid settings raise here. An unreachable broker is
    retried for FIRST_CONNECT_DEADLINE_S (15 s) before BrokerUnavailable.
    """
    settings = group_options(options, keywords, "subscribe")
    config = shared_group_config(stream, settings)
    member_id = settings.member_id
    check_group(group)
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise InvalidArgument(f"max_in_flight={max_in_flight!r} must be an int >= 1")
    if not callable(handler):
        raise InvalidArgument(f"handler must be callable, got {type(handler).__name__}")
    member = member_id or f"{default_member_id()}-{next(_member_numbers)}"
    subscription = Subscription(client, stream, group, handler, config, member, max_in_flight)
    subscription._start()
    subscription._wait_started()
    return subscription


@dataclass
class SubscriptionStats:
    """What a subscription moved on its streams (all connections together).

    ``deliveries / batches`` is the mean number of deliveries per stream
    message from the broker; ``acks / requests`` the mean acks per request.
    """

    deliveries: int = 0  # deliveries received
    batches: int = 0     # DeliveryBatch stream messages received
    requests: int = 0    # SubscribeRequests sent (openings included)
    acks: int = 0        # acks sent on a stream
    nacks: int = 0       # nacks sent on a stream
    credits: int = 0     # credits granted (openings included)


class SubscriptionCounters:
    """SubscriptionStats behind a lock: the receiving thread and gRPC's sender threads add."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = SubscriptionStats()

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, count in counts.items():
                setattr(self._stats, name, getattr(self._stats, name) + count)

    def snapshot(self) -> SubscriptionStats:
        with self._lock:
            return dataclasses.replace(self._stats)


class Subscription:
    """A running push subscription; ``stop()`` ends it, ``join()`` waits for its end.

    ``error`` holds the exception that ended it (stream or group deleted,
    invalid settings); ``join`` raises it.
    """

    def __init__(self, client: Client, stream: str, group: str,
                 handler: Callable[[Lease], object], config: pb.SharedGroupConfig,
                 member_id: str, max_in_flight: int) -> None:
        self.client = client
        self.stream = stream
        self.group = group
        self.member_id = member_id
        self.max_in_flight = max_in_flight
        self.error: BaseException | None = None
        self._handler = handler
        self._config = config
        self._lock = threading.Lock()
        self._running_handlers = 0
        self._idle = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._stop_requested = False  # _stopping as a plain attribute, for the handler path
        self._started = threading.Event()  # accepted by the broker, or failed for good
        self._connection: Outbox | None = None
        self._workers = Dispatcher(self._handle, max_in_flight,
                                    f"npstream-handler-{stream}/{group}")
        self._unary = unary_settler(client, member_id)
        self._counters = SubscriptionCounters()
        self._credit_batch = max(1, max_in_flight // CREDIT_BATCH_DIVISOR)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"npstream-subscription-{stream}/{group}")

    # ------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float | None = STOP_TIMEOUT_S) -> None:
        """Take no new messages, let running handlers finish (up to timeout), then close."""
        self._stop_requested = True
        self._stopping.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._running_handlers:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    log.warning("stopping subscription to '%s' (group '%s') with %d handler(s) "
                                "still running; their leases expire and are redelivered",
                                self.stream, self.group, self._running_handlers)
                    break
                self._idle.wait(left)
            connection = self._connection
        if connection is not None:
            connection.close()  # half-close: the broker ends the call
        self._thread.join(timeout)
        if self._thread.is_alive() and connection is not None and connection.call is not None:
            connection.call.cancel()
            self._workers.abandon()  # no thread may be free to read the end of the call
            self._thread.join(timeout)
        self._workers.close()

    def close(self) -> None:
        """Same as ``stop()`` with the default timeout."""
        self.stop()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the subscription ends; raises the error that ended it, if any."""
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stats(self) -> SubscriptionStats:
        """Counts of deliveries, batches, requests, acks, nacks and credits so far."""
        return self._counters.snapshot()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (f"Subscription(stream={self.stream!r}, group={self.group!r}, "
                f"member_id={self.member_id!r}, {state})")

    # ------------------------------------------------------------ the call

    def _wait_started(self) -> None:
        """Block until the broker accepted the subscription; raise what refused it."""
        self._started.wait()
        if self.error is not None:
            self._workers.close()
            raise self.error

    def _fail(self, exc: BaseException) -> None:
        self.error = exc
        self._started.set()

    def _run(self) -> None:
        backoff = RECONNECT_INITIAL_S
        first_deadline = time.monotonic() + FIRST_CONNECT_DEADLINE_S
        try:
            self._connect_loop(backoff, first_deadline)
        finally:
            self._workers.close()  # after the leases already queued
            self._started.set()  # never leave subscribe() waiting

    def _connect_loop(self, backoff: float, first_deadline: float) -> None:
        while not self._stopping.is_set():
            try:
                self._one_connection()
                backoff = RECONNECT_INITIAL_S
                if not self._stopping.is_set():
                    log.info("subscription to '%s' (group '%s') ended by the broker; "
                             "reconnecting", self.stream, self.group)
            except BrokerUnavailable as exc:
                if not self._started.is_set() and time.monotonic() >= first_deadline:
                    self._fail(exc)  # never connected: subscribe() raises it
                    break
                log.warning("subscription to '%s' (group '%s') lost the broker, reconnecting "
                            "in %.1fs: %s", self.stream, self.group, backoff, exc)
                if self._stopping.wait(backoff):
                    break
                backoff = min(backoff * RECONNECT_MULTIPLIER, RECONNECT_MAX_S)
            except NpstreamError as exc:
                log.error("subscription to '%s' (group '%s') failed: %s", self.stream,
                          self.group, exc)
                self._fail(exc)
                break
            except Exception as exc:
                log.exception("subscription to '%s' (group '%s') failed", self.stream,
                              self.group)
                self._fail(exc)
                break

    def _one_connection(self) -> None:
        with self._lock:
            credits = max(0, self.max_in_flight - self._running_handlers)
            opening = pb.SubscribeRequest(credits=credits)
            opening.open.CopyFrom(pb.SubscribeRequest.Open(
                stream=self.stream, group=self.group, member_id=self.member_id,
                config=self._config, arrow_deliveries=True))
            connection = Outbox(opening, self._credit_batch, self._counters, lock=self._lock,
                                closed=self._settle)
            self._connection = connection
        if self._stopping.is_set():
            connection.close()
        call = group_rpc.subscribe_batches(self.client, connection.request_iterator())
        connection.call = call
        try:
            # The broker sends headers once it has opened the group: the handshake
            # that lets subscribe() return only when the member is in the group.
            if any(key == metadata_keys.MEMBER_ID for key, _ in call.initial_metadata() or ()):
                self._started.set()
            self._workers.serve(Feed(call, lambda batch: self._leases(batch, connection)))
        finally:
            connection.close()
            with self._lock:
                if self._connection is connection:
                    self._connection = None

    def _leases(self, batch: pb.DeliveryBatch, connection: Outbox) -> Iterator[Lease]:
        """The leases of a batch, counted as running; none (all nacked) while stopping.

        Lazily made (the dispatcher takes them a chunk at a time), from one
        Arrow table or from protobuf Delivery messages. They settle through
        ``connection`` (the call they came on) while it is open, then through
        whichever call is current, or a unary call.
        """
        leases: Iterator[Lease]
        if batch.count:  # Arrow deliveries (a broker that predates them sends protobuf)
            table = pa.ipc.open_stream(pa.py_buffer(batch.arrow_stream)).read_all()
            count = table.num_rows
            leases = Lease.iter_table(self.stream, self.group, table, connection.settle)
        else:
            count = len(batch.deliveries)
            leases = iter([Lease.from_pb(self.stream, self.group, delivery, connection.settle)
                           for delivery in batch.deliveries])
        self._counters.add(batches=1, deliveries=count)
        if self._stopping.is_set():
            for lease in leases:
                lease.nack()  # arrived while stopping: give it to another member now
            return iter(())
        with self._lock:
            self._running_handlers += count
        return leases

    def _handle(self, lease: Lease) -> None:
        """Run the handler on one lease, then ack it (unless settled) and free its slot.

        The ack of a lease the handler left unsettled and the credit of its
        slot are queued in one critical section (the outbox shares this
        subscription's lock), with the handler count.
        """
        ack = None
        try:
            self._handler(lease)
        except Exception:
            log.exception("handler failed on offset %d of stream '%s' (group '%s', attempt %d);"
                          " nacking it", lease.offset, self.stream, self.group, lease.attempt)
            self._safe_settle(lease, "nack")
        else:
            states = lease[LEASE_STATES]
            index = lease[LEASE_INDEX]
            if not states[index]:  # returning acks the lease
                states[index] = "ack"
                ack = lease[LEASE_OFFSET]
        finally:
            with self._lock:
                self._running_handlers -= 1
                stopping = self._stop_requested
                if stopping:  # stop() sets the flag before it waits under this lock
                    self._idle.notify_all()
                connection = self._connection
                queued = None if connection is None else connection.finish_locked(
                    ack, not stopping)
        if queued:
            # Hand the GIL to the sender the outbox just woke: a thread running a batch
            # of fast handlers would otherwise keep it for the interpreter's switch
            # interval (5 ms), and the broker would get the credits only after the
            # whole batch (a stop-and-wait of one max_in_flight window per round trip).
            # Only the handler that made the outbox due hands it over: the ones after
            # it, until the sender drains, would each force a thread switch for
            # nothing (a third of a busy subscription's time went to them).
            time.sleep(0)
        elif queued is None and ack is not None:  # no open call: a unary ack
            try:
                self._unary(lease, "ack", 0)
            except NpstreamError as exc:
                self._not_settled(lease, "ack", exc)

    def _safe_settle(self, lease: Lease, how: str) -> None:
        try:
            lease.ack() if how == "ack" else lease.nack()
        except NpstreamError as exc:
            self._not_settled(lease, how, exc)

    def _not_settled(self, lease: Lease, how: str, exc: NpstreamError) -> None:
        log.warning("could not %s offset %d of stream '%s' (group '%s'): %s; it will be "
                    "redelivered after its lease expires", how, lease.offset, self.stream,
                    self.group, exc)

    def _settle(self, lease: Lease, how: str, delay_ms: int) -> None:
        """Send the ack/nack on the live stream, or as a unary call when there is none."""
        connection = self._connection  # one read; a connection closed since refuses (False)
        sent = connection is not None and (
            connection.ack(lease.offset) if how == "ack" else
            connection.nack(lease.offset, delay_ms))
        if not sent:
            self._unary(lease, how, delay_ms)

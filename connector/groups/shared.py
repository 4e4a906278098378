"""Shared groups (Nexo model): many consumers split a stream's messages, each one leased.

Two ways to consume, mixable within one group:

* ``client.receive(stream, group, max=10, wait=...)`` (pull) returns Lease
  objects; call ``lease.ack()`` when done or ``lease.nack(delay)`` to have it
  redelivered.
* ``client.subscribe(stream, group, handler, max_in_flight=...)`` (push) opens
  a GroupService.SubscribeBatches stream and calls ``handler(lease)`` in
  worker threads. Credits are the flow control: the broker never has more
  than ``max_in_flight`` unfinished deliveries out to this subscription. A
  handler that returns without settling its lease acks it; one that raises
  nacks it (the broker's backoff applies). The subscription reconnects by
  itself when the broker restarts.

Push delivery is batched both ways, because one gRPC stream message per
delivery and per ack is what limits a Python consumer: the broker sends
everything ready that fits the credits in one DeliveryBatch, and the client
sends acks, nacks and freed credits together, when enough have piled up or
ACK_FLUSH_INTERVAL_S after the first one, whichever comes first.

A lease that is neither acked nor nacked within ``ack_wait`` seconds expires
and the message goes to another member (at-least-once). After
``max_deliver`` attempts it is copied to the dead-letter stream.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from npstream.errors import BrokerUnavailable, InvalidArgument, NpstreamError
from npstream.proto import metadata_keys, pb
from npstream.proto.names import validate_group_name, validate_stream_name
from npstream.proto.units import parse_duration_ms

if TYPE_CHECKING:
    from npstream.client.client import Client
    from npstream.client.connection import StreamingCall

__all__ = ["Lease", "Subscription", "SubscriptionStats", "ack_leases", "receive", "subscribe"]

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
# Initial-metadata key the broker sends once a Subscribe call has joined the group.
# Coalescing of what a subscription sends back on its stream (acks, nacks and
# the credits their handlers freed): one SubscribeRequest carries everything
# settled since the previous one. It is sent ACK_FLUSH_INTERVAL_S after the
# first unsent item at the latest, so a lone message is acked within a few
# ms; sooner when max_in_flight // CREDIT_BATCH_DIVISOR credits are free (so
# a busy subscription does not wait for the timer, and the broker is not left
# without credits while the rest of a batch is handled) or ACK_FLUSH_MAX
# acks/nacks are pending (bounds the request size).
ACK_FLUSH_INTERVAL_S = 0.002
CREDIT_BATCH_DIVISOR = 4
ACK_FLUSH_MAX = 1000
# The rpc subscriptions use; GroupService.Subscribe (one message per delivery)
# is kept on the broker for older clients.
SUBSCRIBE_RPC = "GroupService.SubscribeBatches"

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_member_numbers = itertools.count(1)


def default_member_id() -> str:
    """"host-pid": one member per process for receive() unless member_id is given."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _config(stream: str, ack_wait: object, max_deliver: int,
            backoff: Sequence[object] | None, dead_letter_stream: str | None
            ) -> pb.SharedGroupConfig:
    try:
        validate_stream_name(stream)
        ack_wait_ms = parse_duration_ms(ack_wait)
        backoff_ms = [parse_duration_ms(b) for b in (backoff or ())]
        if dead_letter_stream is not None:
            validate_stream_name(dead_letter_stream)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    if ack_wait_ms < 1:
        raise InvalidArgument(f"ack_wait={ack_wait!r} must be at least 1 ms")
    if isinstance(max_deliver, bool) or not isinstance(max_deliver, int) or max_deliver < 0:
        raise InvalidArgument(f"max_deliver={max_deliver!r} must be an int >= 0 (0 = unlimited)")
    return pb.SharedGroupConfig(ack_wait_ms=ack_wait_ms, max_deliver=max_deliver,
                                backoff_ms=backoff_ms,
                                dead_letter_stream=dead_letter_stream or "")


def _check_group(group: str) -> None:
    try:
        validate_group_name(group)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


@dataclass(eq=False)
class Lease:
    """One delivery of one message; settle it with ``ack()`` or ``nack(delay)``.

    ``attempt`` is 1 on the first delivery. ``lease_expires_ms`` is when the
    broker gives the message to someone else unless it is settled.
    Settling twice is a no-op.
    """

    stream: str
    group: str
    offset: int
    id: str
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    timestamp_ms: int
    attempt: int
    lease_expires_ms: int
    _settle: Callable[[Lease, str, int], None] = field(repr=False, compare=False)
    settled: str = ""  # "", "ack" or "nack"

    @classmethod
    def from_pb(cls, stream: str, group: str, d: pb.Delivery,
                settle: Callable[[Lease, str, int], None]) -> Lease:
        return cls(stream, group, d.offset, d.id, d.key if d.HasField("key") else None,
                   d.value, dict(d.headers) if d.headers else {}, d.timestamp_ms, d.attempt,
                   d.lease_expires_ms, settle)

    @property
    def timestamp(self) -> dt.datetime:
        return _EPOCH + dt.timedelta(milliseconds=self.timestamp_ms)

    @property
    def lease_expires(self) -> dt.datetime:
        return _EPOCH + dt.timedelta(milliseconds=self.lease_expires_ms)

    def text(self) -> str:
        return self.value.decode("utf-8")

    def ack(self) -> None:
        """Done: the message is not delivered again."""
        if not self.settled:
            self.settled = "ack"
            self._settle(self, "ack", 0)

    def nack(self, delay: float = 0) -> None:
        """Not done: redeliver (to any member) now, or after ``delay`` seconds."""
        if not self.settled:
            try:
                delay_ms = parse_duration_ms(delay)
            except ValueError as exc:
                raise InvalidArgument(f"nack delay: {exc}") from None
            self.settled = "nack"
            self._settle(self, "nack", delay_ms)


def _unary_settler(client: Client, member_id: str) -> Callable[[Lease, str, int], None]:
    def settle(lease: Lease, how: str, delay_ms: int) -> None:
        if how == "ack":
            client.call("GroupService.Ack", pb.AckRequest(
                stream=lease.stream, group=lease.group, offsets=[lease.offset],
                member_id=member_id))
        else:
            client.call("GroupService.Nack", pb.NackRequest(
                stream=lease.stream, group=lease.group, offsets=[lease.offset],
                delay_ms=delay_ms, member_id=member_id))
    return settle


def ack_leases(client: Client, leases: Sequence[Lease]) -> int:
    """Ack many leases with one call per (stream, group); returns how many the broker counted."""
    groups: dict[tuple[str, str], list[int]] = {}
    for lease in leases:
        if not lease.settled:
            lease.settled = "ack"
            groups.setdefault((lease.stream, lease.group), []).append(lease.offset)
    acked = 0
    for (stream, group), offsets in groups.items():
        acked += client.call("GroupService.Ack", pb.AckRequest(
            stream=stream, group=group, offsets=offsets)).acked
    return acked


def receive(
    client: Client,
    stream: str,
    group: str,
    max: int = 10,
    *,
    wait: float = 0.0,
    ack_wait: float = 30.0,
    max_deliver: int = 0,
    backoff: Sequence[float] | None = None,
    dead_letter_stream: str | None = None,
    member_id: str | None = None,
) -> list[Lease]:
    """Lease up to ``max`` messages of the shared group (created on first use).

    Redeliveries that are due come first, then new messages in offset order.
    ``wait`` seconds long-polls when there is nothing to deliver.
    """
    config = _config(stream, ack_wait, max_deliver, backoff, dead_letter_stream)
    _check_group(group)
    if max < 1:
        raise InvalidArgument(f"max={max} must be >= 1")
    if wait < 0:
        raise InvalidArgument(f"wait={wait} must be >= 0 seconds")
    member = member_id or default_member_id()
    response = client.call(
        "GroupService.Receive",
        pb.ReceiveRequest(stream=stream, group=group, member_id=member, max_messages=max,
                          wait_ms=int(wait * 1000), config=config),
        timeout=client.timeout + wait,
    )
    settle = _unary_settler(client, member)
    return [Lease.from_pb(stream, group, d, settle) for d in response.deliveries]


def subscribe(
    client: Client,
    stream: str,
    group: str,
    handler: Callable[[Lease], object],
    *,
    ack_wait: float = 30.0,
    max_in_flight: int = 100,
    max_deliver: int = 0,
    backoff: Sequence[float] | None = None,
    dead_letter_stream: str | None = None,
    member_id: str | None = None,
) -> Subscription:
    """Start a push subscription; see the module docstring.

    Returns once the broker has accepted it (the member is in the group), so
    a missing stream or invalid settings raise here. An unreachable broker is
    retried for FIRST_CONNECT_DEADLINE_S (15 s) before BrokerUnavailable.
    """
    config = _config(stream, ack_wait, max_deliver, backoff, dead_letter_stream)
    _check_group(group)
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


class _Counters:
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


class _Connection:
    """One Subscribe call: an outbox of acks, nacks and credits, and the response iterator.

    The request iterator (run by gRPC's sender thread) sends whatever piled up
    as one request (plus one per further nack delay) once the outbox is due:
    ``credit_batch`` credits or ACK_FLUSH_MAX acks/nacks are waiting, or the
    oldest item has waited ACK_FLUSH_INTERVAL_S, or the call is closing.
    """

    def __init__(self, opening: pb.SubscribeRequest, credit_batch: int,
                 counters: _Counters) -> None:
        self._cond = threading.Condition()
        self._opening: pb.SubscribeRequest | None = opening
        self._credit_batch = credit_batch
        self._counters = counters
        self._acks: list[int] = []
        self._nacks: dict[int, list[int]] = {}  # delay_ms -> offsets
        self._nacked = 0
        self._credits = 0
        self._since: float | None = None  # when the oldest unsent item was added
        self.open = True
        self.call: StreamingCall | None = None

    def _due_locked(self) -> bool:
        return (self._opening is not None or self._credits >= self._credit_batch
                or len(self._acks) + self._nacked >= ACK_FLUSH_MAX)

    def _drain_locked(self) -> list[pb.SubscribeRequest]:
        out: list[pb.SubscribeRequest] = []
        credits = self._credits
        if self._opening is not None:
            credits += self._opening.credits
            out.append(self._opening)
            self._opening = None
        nacks = list(self._nacks.items())
        if self._acks or self._credits or nacks:
            request = pb.SubscribeRequest(ack_offsets=self._acks, credits=self._credits)
            if nacks:  # the first nack delay rides along, further ones need a request each
                delay_ms, offsets = nacks.pop(0)
                request.nack_offsets.extend(offsets)
                request.nack_delay_ms = delay_ms
            out.append(request)
        out.extend(pb.SubscribeRequest(nack_offsets=offsets, nack_delay_ms=delay_ms)
                   for delay_ms, offsets in nacks)
        if out:
            self._counters.add(requests=len(out), acks=len(self._acks), nacks=self._nacked,
                               credits=credits)
        self._acks, self._nacks, self._nacked, self._credits = [], {}, 0, 0
        self._since = None
        return out

    def request_iterator(self) -> Iterator[pb.SubscribeRequest]:
        while True:
            with self._cond:
                while self.open and not self._due_locked():
                    if self._since is None:
                        self._cond.wait()
                        continue
                    left = self._since + ACK_FLUSH_INTERVAL_S - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch = self._drain_locked()
                if not batch and not self.open:
                    return  # half-close once everything queued was sent
            yield from batch

    def _add_locked(self) -> bool:
        """After adding an item: wake the sender if it must arm its timer or send now."""
        if self._since is None:
            self._since = time.monotonic()
            self._cond.notify()
        elif self._due_locked():
            self._cond.notify()
        return True

    def ack(self, offset: int) -> bool:
        with self._cond:
            if not self.open:
                return False
            self._acks.append(offset)
            return self._add_locked()

    def nack(self, offset: int, delay_ms: int) -> bool:
        with self._cond:
            if not self.open:
                return False
            self._nacks.setdefault(delay_ms, []).append(offset)
            self._nacked += 1
            return self._add_locked()

    def grant(self, credits: int) -> bool:
        with self._cond:
            if not self.open:
                return False
            self._credits += credits
            return self._add_locked()

    def close(self) -> None:
        """Send what is queued at once, then half-close."""
        with self._cond:
            self.open = False
            self._cond.notify()


class _Feed:
    """One Subscribe call's response stream, as the dispatcher's threads read it.

    ``leases(batch)`` turns a DeliveryBatch into the leases to run (none while
    stopping). ``done`` is set once the stream ended (``error`` says how) or
    the subscription gave up on it.
    """

    def __init__(self, batches: Iterator[pb.DeliveryBatch],
                 leases: Callable[[pb.DeliveryBatch], list[Lease]]) -> None:
        self.batches = batches
        self.leases = leases
        self.error: BaseException | None = None
        self.done = threading.Event()


class _Dispatcher:
    """Threads that read the call's batches and run handler(lease): leader and followers.

    Why: handing each batch from the thread that read it to a handler thread
    cost a thread wake-up on every delivery's path (~80 us at p50, ~400 us at
    p99 on two busy cores). Here reading is a work item like a lease: the
    thread that reads a batch puts the reading back on the queue (another
    thread picks it up), then the batch's other leases, and runs the oldest
    lease itself, so a lone message reaches its handler on the thread that
    received it and the next reader's wake-up overlaps the handler.

    The work queue is a ``queue.SimpleQueue``: a put wakes one waiting thread
    in C. (A ``threading.Condition`` here woke threads through Python-level
    locks, and with a hundred leases per batch the subscription spent 2.5x the
    CPU per message: shared-group throughput fell from 56 k to 24 k msg/s.)

    What stays as it was: leases start in the order they arrived (one FIFO
    queue); at most ``size`` threads (max_in_flight), started when the leases
    queued or running plus one reader outnumber them, so a slow handler never
    holds up the leases behind it: another thread reads and runs them. Daemon
    threads: a handler still running at interpreter exit is abandoned and its
    lease expires (at-least-once).
    """

    def __init__(self, run: Callable[[Lease], None], size: int, name: str) -> None:
        self._run = run
        self._size = size
        self._name = name
        # Work: a lease to run, a feed to read the next batch of, None to exit.
        self._items: queue.SimpleQueue[Lease | _Feed | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # the counts below, thread starts vs close
        self._feed: _Feed | None = None  # the call being read, None between calls
        self._active = 0  # leases queued or running
        self._threads = 0
        self._closed = False

    def serve(self, feed: _Feed) -> None:
        """Have the threads read and handle ``feed`` until it ends; raise what ended it."""
        with self._lock:
            if self._closed:
                return
            self._feed = feed
            self._start_threads_locked()
        self._items.put(feed)  # a reader
        feed.done.wait()
        with self._lock:
            if self._feed is feed:
                self._feed = None
        if feed.error is not None:
            raise feed.error

    def abandon(self) -> None:
        """End serve() without waiting for a reader (stop() when every thread is stuck)."""
        with self._lock:
            feed, self._feed = self._feed, None
        if feed is not None:
            feed.done.set()

    def _start_threads_locked(self) -> None:
        """Threads for every lease queued or running plus one reader, up to size."""
        while self._threads < min(self._size, self._active + 1) and not self._closed:
            self._threads += 1
            threading.Thread(target=self._work, daemon=True,
                             name=f"{self._name}-{self._threads}").start()

    def _work(self) -> None:
        while (item := self._items.get()) is not None:
            lease = self._read(item) if isinstance(item, _Feed) else item
            if lease is None:
                continue
            try:
                self._run(lease)
            except Exception:  # a bug past _handle's guard: keep the thread (a reader)
                log.exception("subscription thread failed on offset %d", lease.offset)
            finally:
                with self._lock:
                    self._active -= 1

    def _read(self, feed: _Feed) -> Lease | None:
        """Read one batch; queue the reading and its leases, return the oldest to run here."""
        try:
            leases = feed.leases(next(feed.batches))
        except StopIteration:
            self._end(feed, None)
            return None
        except BaseException as exc:  # the call's error: serve() raises it
            self._end(feed, exc)
            return None
        with self._lock:
            current = self._feed is feed
            self._active += len(leases)
            self._start_threads_locked()
        if current:
            self._items.put(feed)  # the next batch, read by another thread
        for lease in leases[1:]:
            self._items.put(lease)
        return leases[0] if leases else None

    def _end(self, feed: _Feed, error: BaseException | None) -> None:
        with self._lock:
            if self._feed is feed:
                self._feed = None
        if not feed.done.is_set():
            feed.error = error
            feed.done.set()

    def close(self) -> None:
        """Threads end once the leases queued so far are handled; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = self._threads
        for _ in range(threads):
            self._items.put(None)


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
        self._started = threading.Event()  # accepted by the broker, or failed for good
        self._connection: _Connection | None = None
        self._workers = _Dispatcher(self._handle, max_in_flight,
                                    f"npstream-handler-{stream}/{group}")
        self._unary = _unary_settler(client, member_id)
        self._counters = _Counters()
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
                config=self._config))
            connection = _Connection(opening, self._credit_batch, self._counters)
            self._connection = connection
        if self._stopping.is_set():
            connection.close()
        call = self.client.stream(SUBSCRIBE_RPC, connection.request_iterator())
        connection.call = call
        try:
            # The broker sends headers once it has opened the group: the handshake
            # that lets subscribe() return only when the member is in the group.
            if any(key == metadata_keys.MEMBER_ID for key, _ in call.initial_metadata() or ()):
                self._started.set()
            self._workers.serve(_Feed(call, self._leases))
        finally:
            connection.close()
            with self._lock:
                if self._connection is connection:
                    self._connection = None

    def _leases(self, batch: pb.DeliveryBatch) -> list[Lease]:
        """The leases of a batch, counted as running; none (all nacked) while stopping."""
        leases = [Lease.from_pb(self.stream, self.group, delivery, self._settle)
                  for delivery in batch.deliveries]
        self._counters.add(batches=1, deliveries=len(leases))
        if self._stopping.is_set():
            for lease in leases:
                lease.nack()  # arrived while stopping: give it to another member now
            return []
        with self._lock:
            self._running_handlers += len(leases)
        return leases

    def _handle(self, lease: Lease) -> None:
        try:
            self._handler(lease)
        except Exception:
            log.exception("handler failed on offset %d of stream '%s' (group '%s', attempt %d);"
                          " nacking it", lease.offset, self.stream, self.group, lease.attempt)
            self._safe_settle(lease, "nack")
        else:
            self._safe_settle(lease, "ack")
        finally:
            with self._lock:
                self._running_handlers -= 1
                current = self._connection
                stopping = self._stopping.is_set()
                if stopping:  # stop() sets the flag before it waits under this lock
                    self._idle.notify_all()
            if current is not None and not stopping:
                current.grant(1)

    def _safe_settle(self, lease: Lease, how: str) -> None:
        try:
            lease.ack() if how == "ack" else lease.nack()
        except NpstreamError as exc:
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

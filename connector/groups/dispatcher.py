"""The threads of a push subscription: they read its call and run the handler per lease.

Why a module of its own: how handler threads are fed decides a subscription's
latency and CPU cost (the ``Dispatcher`` docstring has the numbers), and its
promises (leases start in arrival order, a slow handler never holds up the
leases behind it, ``stop()`` ends even when every handler is stuck) are
independent of the gRPC call and of what a handler does with its lease. The
subscription (``npstream.groups.subscription``) hands it one ``Feed`` per
call and a function to run per lease.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING

from npstream.proto import pb

if TYPE_CHECKING:
    from npstream.groups.leases import Lease

__all__ = ["Dispatcher", "Feed"]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- tuning
# Threads a subscription starts with: one reads the call and runs the handlers.
INITIAL_THREADS = 1
# How long queued work may wait with no thread taking any (or the reader stay in
# one handler) before the watchdog wakes or adds a thread (all are in handlers
# that block): the most a blocked handler holds up the leases behind it, per
# thread added.
STALL_S = 0.002
# Leases are made from a batch this many at a time, as the threads get to them:
# fewer than the interpreter's first garbage-collection threshold (700 new
# objects) alive at once, so a batch of 500 does not set off a collection that
# walks every lease in it (a tenth of a fast subscription's time otherwise).
LEASE_CHUNK = 128
# A watchdog tick this much later than STALL_S means the whole process was held
# up (a garbage collection, other processes on the cores, a thread keeping the
# interpreter lock): no sign of a blocked handler, so it looks again instead.
LATE_S = 0.010


class Feed:
    """One Subscribe call's response stream, as the dispatcher's threads read it.

    ``leases(batch)`` turns a DeliveryBatch into the leases to run (none while
    stopping). ``done`` is set once the stream ended (``error`` says how) or
    the subscription gave up on it.
    """

    def __init__(self, batches: Iterator[pb.DeliveryBatch],
                 leases: Callable[[pb.DeliveryBatch], Iterable[Lease]]) -> None:
        self.batches = batches
        self.leases = leases
        self.error: BaseException | None = None
        self.done = threading.Event()


# A work item that only wakes an idle thread (the watchdog's, when leases wait).
_WAKE = "wake"


class Dispatcher:
    """Threads that read the call's batches and run handler(lease), one thread if it keeps up.

    Why: handing each batch from the thread that read it to a handler thread
    cost a thread wake-up on every delivery's path (~80 us at p50, ~400 us at
    p99 on two busy cores), and two threads running fast handlers side by side
    spend a fifth of their time handing the interpreter lock to each other.
    So one thread holds the reading: it reads a batch, runs its leases, and
    reads the next once none is left (the broker keeps sending within the
    credits meanwhile, so the next batch is usually in gRPC's buffer by then).
    A lone message reaches its handler on the thread that received it.

    Leases wait in one ``collections.deque`` (LEASE_CHUNK of a batch go in
    with one ``extend``, made then from the batch's columns; a thread takes
    the oldest with ``popleft``, both C calls, atomic under the interpreter
    lock); other work (the reading, a wake-up,
    the end) goes through a ``queue.SimpleQueue``, whose put wakes one waiting
    thread in C. (A ``threading.Condition`` woke threads through Python-level
    locks: with a hundred leases per batch the subscription spent 2.5x the CPU
    per message. A queue item per lease cost a put and a get per message.)

    More threads only when handlers block: a watchdog thread notices work that
    no thread took for STALL_S (the oldest waiting lease stayed the same, a
    queued item stayed queued, or the reader stayed in one handler with nobody
    reading) and wakes an idle thread, hands the reading to one, or adds one,
    up to ``size`` (max_in_flight). So handlers that block never hold up the
    leases behind them for longer than STALL_S per added thread, and fast
    handlers run on one thread whatever max_in_flight is (a thread per
    in-flight lease made every lease wake a thread and every thread fight for
    the GIL: with max_in_flight=1000 throughput fell to half). A tick that
    came LATE_S late means the whole process was held up, not a handler:
    the watchdog looks again instead of adding a thread.

    What stays as it was: leases start in the order they arrived (one FIFO,
    one reader at a time); a stuck handler's leases behind it are taken by
    another thread. Daemon threads: a handler still running at interpreter
    exit is abandoned and its lease expires (at-least-once).
    """

    def __init__(self, run: Callable[[Lease], None], size: int, name: str) -> None:
        self._run = run
        self._size = size
        self._name = name
        self._leases: deque[Lease] = deque()  # leases to run, oldest first
        self._rest: Iterator[Lease] | None = None  # the rest of the batch read last, lazily
        # Other work: a feed to take the reading of, _WAKE, None to exit.
        self._items: queue.SimpleQueue[Feed | str | None] = queue.SimpleQueue()
        # Guards thread starts vs close, and the reading: who holds it, whether it waits.
        self._lock = threading.Lock()
        self._feed: Feed | None = None  # the call being read, None between calls
        self._reader: object | None = None  # the token of the thread that holds the reading
        self._reading = False  # the reader is in next() (or decoding what it returned)
        self._steps = 0  # batches read and items taken: with the oldest lease, the progress
        self._threads = 0
        self._idle = 0  # threads waiting for an item
        # Work appeared: wakes a waiting watchdog. A SimpleQueue, not an Event: its put
        # is one C call, where Event.set runs a Condition's Python code on the path of
        # every batch (a lone message's included) before its handler.
        self._queued: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._watch_waiting = False  # the watchdog waits on _queued (no work to watch)
        self._closed = False
        self._watchdog: threading.Thread | None = None

    def serve(self, feed: Feed) -> None:
        """Have the threads read and handle ``feed`` until it ends; raise what ended it."""
        with self._lock:
            if self._closed:
                return
            self._feed = feed
            self._reader = None
            while self._threads < min(self._size, INITIAL_THREADS):
                self._start_thread_locked()
            if self._watchdog is None and self._size > self._threads:
                self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                                  name=f"{self._name}-watchdog")
                self._watchdog.start()
        self._items.put(feed)  # the reading, for the first idle thread
        self._wake_watchdog()
        feed.done.wait()
        with self._lock:
            if self._feed is feed:
                self._feed = None
                self._reader = None
        if feed.error is not None:
            raise feed.error

    def abandon(self) -> None:
        """End serve() without waiting for a reader (stop() when every thread is stuck)."""
        with self._lock:
            feed, self._feed, self._reader = self._feed, None, None
        if feed is not None:
            feed.done.set()

    def _start_thread_locked(self) -> None:
        if self._threads >= self._size or self._closed:
            return
        self._threads += 1
        threading.Thread(target=self._work, daemon=True,
                         name=f"{self._name}-{self._threads}").start()

    def _wake_watchdog(self) -> None:
        if self._watch_waiting:  # only then: an Event.set is a Python-level notify
            self._watch_waiting = False
            self._queued.put(None)

    # ------------------------------------------------------------ the threads

    def _work(self) -> None:
        me = object()  # this thread, as the holder of the reading
        run = self._run
        take = self._leases.popleft
        feed: Feed | None = None  # the feed this thread reads, while it holds the reading
        while True:
            try:
                lease = take()
            except IndexError:  # no lease waiting: more of the batch, the next one, or wait
                if self._rest is not None and self._refill():
                    continue
                if feed is not None:
                    feed = self._read(feed, me)
                    continue
                with self._lock:
                    self._idle += 1
                item = self._items.get()
                with self._lock:
                    self._idle -= 1
                    self._steps += 1
                    if isinstance(item, Feed) and item is self._feed:
                        self._reader = me
                        feed = item
                if item is None:
                    return
                continue
            try:
                run(lease)
            except Exception:  # a bug past _handle's guard: keep the thread (a reader)
                log.exception("subscription thread failed on offset %d", lease.offset)

    def _read(self, feed: Feed, me: object) -> Feed | None:
        """Read one batch and queue its leases; the feed while ``me`` still holds the reading."""
        with self._lock:
            if self._reader is not me or self._feed is not feed:
                return None  # the watchdog gave the reading to another thread, or it ended
            self._reading = True
        try:
            leases = feed.leases(next(feed.batches))
        except StopIteration:
            self._end(feed, None)
            return None
        except BaseException as exc:  # the call's error: serve() raises it
            self._end(feed, exc)
            return None
        finally:
            with self._lock:
                self._reading = False
                self._steps += 1
        with self._lock:
            self._rest = iter(leases)
        self._refill()
        self._wake_watchdog()
        return feed

    def _refill(self) -> bool:
        """Queue the next LEASE_CHUNK leases of the batch read last; False once it is done."""
        with self._lock:  # one thread at a time: leases go in in order
            if self._rest is None:
                return False
            waiting = len(self._leases)
            self._leases.extend(islice(self._rest, LEASE_CHUNK))
            if len(self._leases) - waiting < LEASE_CHUNK:
                self._rest = None
            return len(self._leases) > waiting

    def _end(self, feed: Feed, error: BaseException | None) -> None:
        with self._lock:
            if self._feed is feed:
                self._feed = None
                self._reader = None
        if not feed.done.is_set():
            feed.error = error
            feed.done.set()

    # ------------------------------------------------------------ the watchdog

    def _watch(self) -> None:
        """Wake, hand the reading to, or add a thread when work waits STALL_S untaken."""
        while not self._closed:
            # Flag first, then look: work that appears after the look sees the flag.
            self._watch_waiting = True
            if not self._watchable():
                self._queued.get()
            self._watch_waiting = False
            while not self._queued.empty():  # wake-ups that raced the look above
                self._queued.get()
            before = self._progress()
            started = time.monotonic()
            time.sleep(STALL_S)
            if (self._closed or time.monotonic() - started > STALL_S + LATE_S
                    or self._progress() != before):
                continue
            self._unstick()

    def _watchable(self) -> bool:
        """Work that a stuck thread could be holding up."""
        return bool(self._leases or self._rest is not None or self._items.qsize()
                    or (self._reader is not None and not self._reading))

    def _progress(self) -> tuple[int, Lease | None]:
        """Changes whenever a thread takes work: a step, or the oldest waiting lease."""
        try:
            return self._steps, self._leases[0]
        except IndexError:
            return self._steps, None

    def _unstick(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._leases or self._rest is not None:
                # The oldest lease waited STALL_S: every thread that runs them is stuck.
                if self._idle:
                    self._items.put(_WAKE)
                else:
                    self._start_thread_locked()
            elif self._reader is not None and not self._reading and self._feed is not None:
                # The reader has been in one handler for STALL_S, and nobody reads: what
                # arrives meanwhile would wait for it. Another thread takes the reading.
                self._reader = None
                self._items.put(self._feed)
                if not self._idle:
                    self._start_thread_locked()
            elif self._items.qsize() and not self._idle:  # an item waited STALL_S
                self._start_thread_locked()

    def close(self) -> None:
        """Threads end once the leases queued so far are handled; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = self._threads
        for _ in range(threads):
            self._items.put(None)
        self._queued.put(None)  # the watchdog sees the flag and ends

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
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from npstream.proto import pb

if TYPE_CHECKING:
    from npstream.groups.leases import Lease

__all__ = ["Dispatcher", "Feed"]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- tuning
# Threads a subscription starts with: one reads the call while one runs handlers.
INITIAL_THREADS = 2
# How long queued work may wait with no thread taking any before the watchdog
# adds a thread (all are in handlers that block): the most a blocked handler
# holds up the leases behind it, per thread added.
STALL_S = 0.002


class Feed:
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


class Dispatcher:
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

    How many threads: as few as keep the queue moving. It starts with
    INITIAL_THREADS (a reader and a handler); a watchdog thread adds one
    whenever work has been queued for STALL_S with no thread taking any,
    up to ``size`` (max_in_flight). So fast handlers run on one or two
    threads (a thread per in-flight lease made every put wake a thread and
    every thread fight for the GIL: with max_in_flight=1000 throughput fell
    to half), while handlers that block still never hold up the leases
    behind them for longer than STALL_S per added thread.

    What stays as it was: leases start in the order they arrived (one FIFO
    queue); a stuck handler's leases behind it are taken by another thread.
    Daemon threads: a handler still running at interpreter exit is abandoned
    and its lease expires (at-least-once).
    """

    def __init__(self, run: Callable[[Lease], None], size: int, name: str) -> None:
        self._run = run
        self._size = size
        self._name = name
        # Work: a lease to run, a feed to read the next batch of, None to exit.
        self._items: queue.SimpleQueue[Lease | Feed | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # thread starts vs close
        self._feed: Feed | None = None  # the call being read, None between calls
        self._threads = 0
        self._taken = 0  # items taken off the queue: the watchdog's sign of progress
        self._queued = threading.Event()  # work was queued: wakes the watchdog
        self._closed = False
        self._watchdog: threading.Thread | None = None

    def serve(self, feed: Feed) -> None:
        """Have the threads read and handle ``feed`` until it ends; raise what ended it."""
        with self._lock:
            if self._closed:
                return
            self._feed = feed
            while self._threads < min(self._size, INITIAL_THREADS):
                self._start_thread_locked()
            if self._watchdog is None and self._size > self._threads:
                self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                                  name=f"{self._name}-watchdog")
                self._watchdog.start()
        self._put(feed)  # a reader
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

    def _start_thread_locked(self) -> None:
        self._threads += 1
        threading.Thread(target=self._work, daemon=True,
                         name=f"{self._name}-{self._threads}").start()

    def _put(self, item: Lease | Feed) -> None:
        self._items.put(item)
        self._queued.set()

    def _watch(self) -> None:
        """Add a thread while queued work sees no thread take any for STALL_S."""
        taken = -1
        while not self._closed:
            self._queued.clear()
            if not self._items.qsize():
                self._queued.wait()
                taken = self._taken
            time.sleep(STALL_S)
            if self._items.qsize() and self._taken == taken:
                with self._lock:
                    if self._threads < self._size and not self._closed:
                        self._start_thread_locked()
            taken = self._taken

    def _work(self) -> None:
        while (item := self._items.get()) is not None:
            self._taken += 1  # a lost update between threads still reads as progress
            lease = self._read(item) if isinstance(item, Feed) else item
            if lease is None:
                continue
            try:
                self._run(lease)
            except Exception:  # a bug past _handle's guard: keep the thread (a reader)
                log.exception("subscription thread failed on offset %d", lease.offset)

    def _read(self, feed: Feed) -> Lease | None:
        """Read one batch; queue the reading and its leases, return the oldest to run here."""
        try:
            leases = feed.leases(next(feed.batches))
        except StopIteration:
            self._end(feed, None)
            return None
        except BaseException as exc:  # the call's error: serve() raises it
            self._end(feed, exc)
            return None
        if self._feed is feed:
            self._items.put(feed)  # the next batch, read by another thread
        for lease in leases[1:]:
            self._items.put(lease)
        self._queued.set()
        return leases[0] if leases else None

    def _end(self, feed: Feed, error: BaseException | None) -> None:
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
        self._queued.set()  # the watchdog sees the flag and ends

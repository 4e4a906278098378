"""Group commit: the writes of many callers made durable by one flush per round.

Every writer of the broker that batches behind one expensive step uses this:
a stream log's appends (one write and one fsync per group, ``CommitQueue``
below), the registry's stream rows (one SQLite transaction), the nursery's
first frames (one fsynced transaction), group positions (one transaction,
groups/store.py) and the shared directory and filesystem syncs (dir_sync.py).

Callers ``submit`` items. Items queue in *rounds*; ``flush(batch)`` (the
owner's, pluggable) makes one round's batch durable. Rounds are flushed one
at a time in the order they were opened, so whatever queues while a flush
runs becomes the next round: one flush for all of it. A round accepts items
until it is taken for its flush, until ``max_size`` would be exceeded (the
first item always fits) or until an item that must go ``alone`` closes it.

Who flushes:

* ``lead=True``: a caller that ``wait``s and finds no flush running flushes
  the oldest queued round itself (the *leader*; no thread hand-off, and an
  idle writer holds no thread). When a flush ends, one waiter of the next
  round is woken to lead it; the other waiters sleep until their round is done.
* ``thread_name``: a background thread flushes rounds nobody waits for (or,
  with ``lead=False``, every round), after lingering ``linger_s`` so that
  more items join. It starts with the first item.

A flush that raises fails its round: every waiter of that round gets the
error, later rounds are untouched. ``requeue(failed, next)`` keeps a failed
round's items for the next round instead of dropping them (the next flush
retries them). The flush may also record per-item outcomes in the items
themselves (CommitQueue does: a failed fsync fails only the items that asked
for it).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from npstream.broker.storage.errors import GroupCommitClosedError

__all__ = ["CommitQueue", "CommitRequest", "GroupCommit", "GroupCommitClosedError", "Round"]

T = TypeVar("T")
B = TypeVar("B")


class Round(Generic[B]):
    """One flush's worth of items: the batch, and once flushed, the outcome.

    Waiting costs nothing until someone must wait: each waiter then sleeps on
    an Event of its own (an uncontended leader never builds one, ~2 us each),
    so the end of a flush wakes its waiters without a turn at the queue's lock.
    """

    __slots__ = ("_event", "_waiters", "batch", "closed", "count", "done", "error", "number",
                 "size")

    def __init__(self, batch: B, number: int) -> None:
        self.batch = batch
        self.number = number  # 1, 2, ... in flush order
        self.size = 0
        self.count = 0  # items submitted into it
        self.closed = False  # takes no more items (an ``alone`` item is in it)
        self.done = False
        self.error: BaseException | None = None
        self._waiters: list[threading.Event] | None = None  # asleep until done (or promoted)
        self._event: threading.Event | None = None


class GroupCommit(Generic[T, B]):
    """Items queued in rounds, each round flushed once (module docstring). Thread-safe."""

    def __init__(
        self,
        flush: Callable[[B], None],
        new_batch: Callable[[], B],
        add: Callable[[B, T], None],
        *,
        max_size: int = 0,
        lead: bool = True,
        thread_name: str = "",
        linger_s: float = 0.0,
        retry_pause_s: float = 0.0,
        idle_look_s: float | None = None,
        requeue: Callable[[B, B], None] | None = None,
    ) -> None:
        """``max_size``: a round's items' total ``size`` (0: no bound).

        ``thread_name`` (empty: no thread): the background flusher's name;
        it waits ``linger_s`` before taking a round, ``retry_pause_s`` after
        a failed flush, and looks for rounds nobody woke it for at least
        every ``idle_look_s`` (None: only when woken).
        """
        assert lead or thread_name, "without leaders a thread must flush"
        self._flush = flush
        self._new_batch = new_batch
        self._add = add
        self._max_size = max_size
        self._lead = lead
        self._requeue = requeue
        self._lock = threading.Lock()
        self._queued: deque[Round[B]] = deque()  # opened, not yet taken, oldest first
        self._flushing: Round[B] | None = None
        # The waiter woken to lead the next flush: until it has taken the head
        # round, nobody else does, so what queues while it wakes joins that round.
        self._handoff: threading.Event | None = None
        self._numbered = 0  # rounds opened so far
        self._closed = False
        self._thread_name = thread_name
        self._thread: threading.Thread | None = None
        self._work = threading.Condition(self._lock)  # the thread: a round to take
        self._idle = False  # the thread waits on _work; the next submit wakes it
        self._linger_s = linger_s
        self._retry_pause_s = retry_pause_s
        self._idle_look_s = idle_look_s

    # ------------------------------------------------------------ callers

    def submit(self, item: T, size: int = 1, *, alone: bool = False,
               wake: bool = True) -> Round[B]:
        """Queue ``item``; the round that will flush it (``wait`` on it).

        ``alone``: the item gets a round of its own. ``wake=False``: do not
        wake the background thread for it (the caller waits for it, so it
        leads the flush itself; the thread still finds it at its next look).
        """
        with self._lock:
            return self._submit_locked(item, size, alone, wake)

    def _submit_locked(self, item: T, size: int, alone: bool, wake: bool) -> Round[B]:
        if self._closed:
            raise GroupCommitClosedError(f"{self._thread_name or 'group commit'} is closed")
        tail = self._queued[-1] if self._queued else None
        if (tail is None or tail.closed or alone
                or (self._max_size and tail.size + size > self._max_size)):
            tail = self._open_locked()
        self._add(tail.batch, item)
        tail.size += size
        tail.count += 1
        tail.closed = alone
        if self._thread_name:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._thread_name,
                                                daemon=True)
                self._thread.start()
            elif wake and self._idle:
                self._idle = False
                self._work.notify()
        return tail

    def wait(self, round_: Round[B], timeout: float | None = None) -> bool:
        """Return once ``round_`` is flushed (False: ``timeout`` seconds passed first).

        Leads the flush of the oldest queued round whenever none is running
        (``lead=True``); raises the round's error if its flush failed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        asleep: threading.Event | None = None
        while not round_.done:
            head: Round[B] | None = None
            with self._lock:
                if round_.done:
                    break
                if asleep is not None and self._handoff is asleep:
                    self._handoff = None  # promoted: lead now, timed out or not
                if self._may_lead_locked():
                    head = self._take_locked()
                else:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    asleep = threading.Event()
                    if round_._waiters is None:
                        round_._waiters = []
                    round_._waiters.append(asleep)
            if head is not None:
                self._flush_round(head)
                continue
            assert asleep is not None
            if not asleep.wait(remaining):
                with self._lock:  # timed out: no longer a waiter (unless promoted meanwhile)
                    if round_._waiters is not None and asleep in round_._waiters:
                        round_._waiters.remove(asleep)
        if round_.error is not None:
            raise round_.error
        return True

    def commit(self, item: T, size: int = 1, *, alone: bool = False) -> None:
        """``submit`` then ``wait``: return once ``item`` is flushed.

        When no flush runs, the item's round is taken for flushing under the
        same turn at the lock as the submit (the uncontended case).
        """
        with self._lock:
            round_ = self._submit_locked(item, size, alone, False)
            head = self._take_locked() if self._may_lead_locked() else None
        if head is not None:
            self._flush_round(head)
        self.wait(round_)

    def waiter(self, round_: Round[B]) -> Callable[[], None]:
        """``wait`` for ``round_`` as a callable of no arguments (to hand to a caller)."""
        def wait() -> None:
            self.wait(round_)

        return wait

    def done_event(self, round_: Round[B]) -> threading.Event:
        """An Event set once ``round_`` is flushed, failed or not (never leads a flush)."""
        with self._lock:
            if round_._event is None:
                round_._event = threading.Event()
                if round_.done:
                    round_._event.set()
            return round_._event

    def oldest(self) -> Round[B] | None:
        """The round being flushed, else the oldest queued one; None when all are flushed."""
        with self._lock:
            return self._flushing or (self._queued[0] if self._queued else None)

    def newest(self) -> Round[B] | None:
        """The round the next item would join if it fits; None when all are flushed."""
        with self._lock:
            return self._queued[-1] if self._queued else self._flushing

    def pending(self) -> int:
        """Items submitted and not yet flushed (queued, or in the flush running)."""
        with self._lock:
            flushing = self._flushing.count if self._flushing is not None else 0
            return flushing + sum(queued.count for queued in self._queued)

    def amend(self, change: Callable[[B], None]) -> None:
        """Apply ``change`` to the batch of every queued round (not to one being flushed)."""
        with self._lock:
            for queued in self._queued:
                change(queued.batch)

    def close(self, timeout: float | None = None) -> None:
        """Refuse new items; the thread flushes what is queued, then ends (``timeout``: join).

        Without a thread, what is queued stays for its waiters to flush.
        """
        with self._lock:
            self._closed = True
            self._work.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # ------------------------------------------------------------ flushing

    def _open_locked(self) -> Round[B]:
        self._numbered += 1
        opened = Round(self._new_batch(), self._numbered)
        self._queued.append(opened)
        return opened

    def _may_lead_locked(self) -> bool:
        """A waiting caller leads: no flush runs and none is handed to another waiter."""
        return (self._lead and self._flushing is None and self._handoff is None
                and bool(self._queued))

    def _take_locked(self) -> Round[B]:
        head = self._queued.popleft()
        head.closed = True
        self._flushing = head
        return head

    def _flush_round(self, round_: Round[B]) -> None:
        """Flush a taken round, then hand the next round to a leader or the thread."""
        error: BaseException | None = None
        try:
            self._flush(round_.batch)
        except BaseException as exc:
            error = exc
        with self._lock:
            if error is not None and self._requeue is not None:
                later = self._queued[0] if self._queued else self._open_locked()
                self._requeue(round_.batch, later.batch)
            round_.error = error
            round_.done = True
            self._flushing = None
            if round_._waiters is not None:
                for asleep in round_._waiters:
                    asleep.set()
                round_._waiters = None
            if round_._event is not None:
                round_._event.set()
            if self._lead:
                for queued in self._queued:  # promote one waiter: it leads the next flush
                    if queued._waiters:
                        self._handoff = queued._waiters.pop(0)
                        self._handoff.set()
                        break
            if self._idle and (self._queued or self._closed):
                self._idle = False
                self._work.notify()

    def _thread_may_take_locked(self) -> bool:
        """A round is queued, no flush runs, and no waiter is about to lead it."""
        if not self._queued or self._flushing is not None or self._handoff is not None:
            return False
        return not (self._lead and any(queued._waiters for queued in self._queued))

    def _run(self) -> None:
        """The background flusher (module docstring)."""
        while True:
            with self._lock:
                while not self._thread_may_take_locked():
                    if self._closed and not self._queued and self._flushing is None:
                        return
                    self._idle = True
                    self._work.wait(self._idle_look_s)
                self._idle = False
                if self._linger_s and not self._closed:
                    self._work.wait(self._linger_s)  # let more items join; close ends it
                    if not self._thread_may_take_locked():
                        continue
                head = self._take_locked()
            self._flush_round(head)
            if head.error is not None and self._retry_pause_s:
                with self._lock:
                    if not self._closed:
                        self._work.wait(self._retry_pause_s)


@dataclass(eq=False)
class CommitRequest(Generic[T]):
    """One append waiting to be written; the writer fills ``result``."""

    payload: T
    nbytes: int
    fsync: bool
    atomic: bool = False
    result: object = None
    sequence: int = 0  # write sequence number of the group that wrote it (for a later sync)
    error: BaseException | None = None

    def outcome(self) -> object:
        if self.error is not None:
            raise self.error
        return self.result


class CommitQueue(Generic[T]):
    """A stream log's appends: a group is written at once and fsynced if any member asks.

    ``write(group)`` writes a group (filling each request's ``result``, or
    its ``error`` for a member it refuses) and returns a write sequence
    number; ``sync(seq)`` returns once everything up to that sequence number
    is fsynced. Groups hold up to ``max_group_bytes`` (at least one request);
    an atomic request is written alone. A failed write fails the whole group;
    a failed fsync fails only the members that waited for it (WRITE members
    were written and are acknowledged).
    """

    def __init__(
        self,
        max_group_bytes: int,
        write: Callable[[list[CommitRequest[T]]], int],
        sync: Callable[[int], None],
    ) -> None:
        self.max_group_bytes = max_group_bytes
        self._write = write
        self._sync = sync
        self._commit: GroupCommit[CommitRequest[T], list[CommitRequest[T]]] = GroupCommit(
            self._write_and_sync, list, list.append, max_size=max_group_bytes)

    def submit(self, request: CommitRequest[T]) -> object:
        """Queue ``request``; return its result once written (and fsynced if asked)."""
        self._commit.commit(request, request.nbytes, alone=request.atomic)
        return request.outcome()

    def pending(self) -> int:
        """Requests submitted and not yet written (queued, or in the group being written)."""
        return self._commit.pending()

    def _write_and_sync(self, group: list[CommitRequest[T]]) -> None:
        sequence = self._write(group)
        sync_error: BaseException | None = None
        if any(member.fsync for member in group):
            try:
                self._sync(sequence)
            except BaseException as exc:
                sync_error = exc
        for member in group:
            if sync_error is not None and member.fsync:
                member.error = sync_error
            member.sequence = sequence

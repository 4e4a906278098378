"""A shared group (Nexo model): members split the messages, each delivery is a lease.

``SharedGroup`` joins the pure lease bookkeeping (leases.LeaseTable) with the
stream's log, waiting, persistence and dead letters:

* Fresh messages are read ahead from the log in Arrow batches and handed
  out in offset order; redeliveries that are due go first, so no member
  idles while work waits, and their rows are cut out of the group's last
  read when it holds them, else read from the log again (log_rows.py).
* What is in flight lives in memory as offset ranges (leases.py), not rows.
  Only the committed offset (lowest not acked) and the dead-lettered count
  are persisted, through the batching PositionWriter. After a restart,
  unacked messages are delivered again.
* One Receive hands out leased messages with their rows (deliveries.py): as
  Python rows for Receive and Subscribe, as one Arrow batch for ReceiveBatch.
* With ``ordering="key"`` fresh messages whose key has an unfinished
  message are held, and leased one at a time as the one before finishes
  (key_order.py, LeaseTable.lease_held).
* Expired leases and nacks schedule redeliveries (with backoff). A message
  out of attempts is copied to the dead-letter stream and counts as done.
* Before every operation the group follows the log's start offset, so
  retention and delete_before leave no lease, pending entry or blocked
  committed offset behind.

Waiting members sleep until the group's wake-up counter moves; nacks, resets,
and acks that give the group budget for new messages again move it, and so do
appends to the log: the group registers an append
listener on the log the first time a member waits, so the thread that wrote a
message wakes the waiting member itself (no watcher thread in between: one
thread hand-off less on every delivery's path). The counter has its own lock,
so the writer never waits for the group lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from itertools import groupby
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa

from npstream.broker.errors import BrokerError, OffsetOutOfRangeError
from npstream.broker.groups.dead_letter import DeadLetter, DeadLetterWriter
from npstream.broker.groups.deliveries import (
    Delivered,
    Grant,
    Rows,
    delivery_table,
    grants,
    rows_from_batch,
)
from npstream.broker.groups.key_order import KeyOrder, Plan
from npstream.broker.groups.leases import LeaseTable, Span, finish_runs
from npstream.broker.groups.log_rows import FreshRows, part_bytes, read_span, read_spans
from npstream.broker.groups.metrics import GroupMetrics
from npstream.broker.groups.shared_config import SharedConfig
from npstream.broker.groups.store import PositionWriter
from npstream.broker.groups.tuning import (
    DEAD_LETTER_RETRY_MS,
    LEASE_MAX_BYTES,
    LONG_POLL_SLICE_S,
    MAX_ACK_WINDOW,
    MAX_PENDING_PER_GROUP,
    MEMBER_IDLE_MS,
)

if TYPE_CHECKING:
    from npstream.broker.storage import StreamLog

__all__ = ["Grant", "MemberInfo", "SharedGroup", "SharedSnapshot", "rows_from_batch"]

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return int(time.time() * 1000)


class MemberInfo(NamedTuple):
    member_id: str
    last_seen_ms: int
    in_flight: int
    connections: int = 0  # open Subscribe calls of the member


class SharedSnapshot(NamedTuple):
    """What DescribeGroup reports for a shared group."""

    committed_offset: int
    in_flight: int
    pending: int
    dead_lettered: int
    members: list[MemberInfo]
    config: SharedConfig


class SharedGroup:
    """One shared group of one stream; thread-safe."""

    kind = "shared"

    def __init__(
        self,
        stream: str,
        group: str,
        *,
        committed: int,
        dead_lettered: int,
        config: SharedConfig,
        log_source: Callable[[], StreamLog],
        writer: PositionWriter,
        dead_letters: DeadLetterWriter,
        metrics: GroupMetrics | None = None,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self.stream = stream
        self.group = group
        self._log_source = log_source
        self._writer = writer
        self._dead_letters = dead_letters
        self._metrics = metrics or GroupMetrics()
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())  # the group lock (nobody waits on it)
        # Waiting receives sleep on _wake (its own lock: no other lock is taken while
        # it is held) until _wake_seq moves; whatever may let them proceed bumps it. The
        # log's append listener bumps it without the group lock, so a writer never
        # waits for a receive that is building a large batch under the group lock.
        self._wake = threading.Condition()
        self._wake_seq = 0
        self._table = LeaseTable(committed, config)
        self._keys = KeyOrder()  # used while config.ordering == "key"
        self._released: list[int] = []  # held offsets whose turn came, to lease first
        self._fresh = FreshRows(committed)  # read ahead from the log, not handed out yet
        self._dead_lettered = dead_lettered
        self._persisted = (committed, dead_lettered)
        self._closed: BrokerError | None = None
        self._waiters = 0
        self._listening: StreamLog | None = None  # the log whose appends wake waiters

    # ------------------------------------------------------------ state helpers

    @property
    def config(self) -> SharedConfig:
        return self._table.config

    @property
    def committed(self) -> int:
        return self._table.committed

    def _changed_locked(self) -> None:
        """Wake waiting receives: something they wait for may have changed."""
        self._bump()

    def _bump(self) -> None:
        with self._wake:
            self._wake_seq += 1
            if self._waiters:
                self._wake.notify_all()

    def _check_open_locked(self) -> None:
        if self._closed is not None:
            raise self._closed

    def _persist_locked(self, waited: bool = False) -> int:
        """Queue the position if it changed; returns the writer ticket (0 if nothing).

        ``waited``: the caller waits for the ticket (and so writes it itself):
        the writer thread is not woken for it.
        """
        position = (self._table.committed, self._dead_lettered)
        if position == self._persisted:
            return 0
        self._persisted = position
        return self._writer.put(self.stream, self.group, *position, wake_writer=not waited)

    def _follow_log_locked(self, stream_log: StreamLog) -> None:
        """Forget what retention or delete_before removed; handle a log that shrank."""
        start, end = stream_log.start_offset, stream_log.end_offset
        if start > self._table.committed:
            before = self._table.committed
            dropped = self._table.drop_below(start)
            self._released += self._keys.drop_below(start)
            self._fresh.clear(self._table.next_fresh)
            log.info("group '%s' on stream '%s': offsets [%d, %d) were removed from the log; "
                     "dropped %d pending deliveries, committed offset now %d",
                     self.group, self.stream, before, start, dropped, self._table.committed)
            self._changed_locked()
        elif self._table.next_fresh > end:
            log.warning("group '%s' on stream '%s': position %d is past end_offset %d; "
                        "resetting to %d", self.group, self.stream, self._table.next_fresh,
                        end, end)
            self._reset_locked(end)

    def _reset_locked(self, offset: int) -> int:
        dropped = self._table.reset(offset)
        self._keys.clear()
        self._released.clear()
        self._fresh.clear(offset)
        self._changed_locked()
        return dropped

    def _fresh_budget_locked(self) -> int:
        return self._table.fresh_budget(MAX_PENDING_PER_GROUP, MAX_ACK_WINDOW)

    def _take_fresh_locked(self, stream_log: StreamLog, limit: int,
                           max_bytes: int) -> list[Rows]:
        """Up to ``limit`` never-delivered rows (about ``max_bytes``, at least one) from
        ``next_fresh`` on (within the budget)."""
        limit = min(limit, self._fresh_budget_locked())
        if limit <= 0 or max_bytes <= 0:
            return []
        try:
            return self._fresh.take(stream_log, limit, max_bytes)
        except OffsetOutOfRangeError:  # retention moved the start meanwhile
            self._follow_log_locked(stream_log)
            return []

    def _redeliveries_locked(self, stream_log: StreamLog, ready: list[Span]) -> list[Delivered]:
        """Spans leased for redelivery with their rows: one delivery per run of spans
        with one attempt number, rows out of the last read when it holds them
        (FreshRows.kept), else read from the log again (read_spans).

        A span whose rows retention removed meanwhile is left out (the next
        look drops it from the table), as are the others of its read.
        """
        out: list[Delivered] = []
        for attempt, same in groupby(ready, key=attrgetter("attempt")):
            spans = list(same)
            ranges = [(span.start, span.end) for span in spans]
            parts = self._fresh.kept(stream_log, ranges)
            if parts is None:
                parts = self._read_ranges_locked(stream_log, ranges)
            count = sum(map(len, parts))
            if count:
                out.append(Delivered(count, attempt, spans[0].expires_ms, parts))
        return out

    def _read_ranges_locked(self, stream_log: StreamLog,
                            ranges: list[tuple[int, int]]) -> list[Rows]:
        """The rows of ``ranges`` read from the log, close ones together (read_spans)."""
        try:
            return [part for parts in read_spans(stream_log, ranges) for part in parts]
        except OffsetOutOfRangeError:  # retention removed some: read one by one
            self._follow_log_locked(stream_log)
            out: list[Rows] = []
            for start, end in ranges:
                try:
                    out += read_span(stream_log, start, end)
                except OffsetOutOfRangeError:
                    continue
            return out

    def _lease_locked(self, stream_log: StreamLog, member: str, limit: int, now: int,
                      ack_wait_ms: int, max_bytes: int) -> list[Delivered]:
        """Lease up to ``limit`` messages with their rows: due redeliveries first, then
        held messages whose turn came (ordering by key), then fresh ones (ordering by
        key: from one read of fresh rows that delivers any, see below).

        About ``max_bytes`` of rows at most (at least one message): fresh rows are
        cut by their size, redeliveries (leased before they are read) by the mean
        size of the rows read so far.
        """
        limit = min(limit, max(1, max_bytes // self._fresh.row_bytes()))
        out = self._redeliveries_locked(
            stream_log, self._table.lease_ready(member, now, ack_wait_ms, limit))
        taken = sum(delivered.size for delivered in out)
        if self._released and taken < limit:
            turn = self._released[:limit - taken]
            del self._released[:limit - taken]
            held = self._redeliveries_locked(
                stream_log, self._table.lease_held(member, turn, now, ack_wait_ms))
            out += held
            taken += sum(delivered.size for delivered in held)
        used = sum(part_bytes(part) for delivered in out for part in delivered.parts)
        while taken < limit:
            start = self._table.next_fresh
            parts = self._take_fresh_locked(stream_log, limit - taken, max_bytes - used)
            if not parts:
                break
            used += sum(map(part_bytes, parts))
            if self.config.ordering != "key":
                count = len(parts[0]) if len(parts) == 1 else sum(map(len, parts))
                plan = Plan([(True, count)], parts)
            else:
                plan = self._keys.plan(start, parts)
            self._table.take_fresh(member, plan.runs, now, ack_wait_ms)
            count = sum(n for deliver, n in plan.runs if deliver)
            if count:
                out.append(Delivered(count, 1, now + ack_wait_ms, plan.rows))
                taken += count
                if self.config.ordering == "key":
                    # Fresh rows are planned once per call: held rows leave the batch a
                    # little short, and planning again for the few missing costs more than
                    # they are worth (each plan has a fixed cost: the keys as Python values,
                    # sets, masks, a filter; docs/benchmarks.md).
                    break
        return out

    def _release_keys_locked(self, ranges: list[tuple[int, int]], finished: int = -1) -> None:
        """Ordering by key: hand out the held message of each key whose message finished.

        ``finished``: how many offsets of ``ranges`` were finished, when known; then
        ``ranges`` are sorted and merged (an ack's runs).
        """
        if self.config.ordering != "key" or not ranges:
            return
        # Offsets of the ranges still unfinished (an ack does not finish a message being
        # dead-lettered): usually none, so a busy offset is finished unless it is in one.
        # When every offset of the ranges was finished there are none to look for.
        left = [] if finished == sum(hi - lo for lo, hi in ranges) else [
            (sp.start, sp.end) for lo, hi in ranges for sp in self._table.spans_in(lo, hi)]
        released = self._keys.finished(ranges, left, merged=finished >= 0)
        if released:
            self._released += released
            self._changed_locked()

    # ------------------------------------------------------------ delivering

    def receive(
        self,
        member: str,
        max_messages: int,
        wait_s: float,
        ack_wait_ms: int,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Grant]:
        """Lease up to max_messages (redeliveries first), waiting up to wait_s for any."""
        return grants(self.lease(member, max_messages, wait_s, ack_wait_ms, should_stop))

    def receive_batch(
        self,
        member: str,
        max_messages: int,
        wait_s: float,
        ack_wait_ms: int,
        should_stop: Callable[[], bool] | None = None,
    ) -> pa.Table:
        """``receive`` as one DELIVERY_SCHEMA table (ReceiveBatch): no Python object per row."""
        return delivery_table(self.lease(member, max_messages, wait_s, ack_wait_ms,
                                         should_stop))

    def lease(self, member: str, max_messages: int, wait_s: float, ack_wait_ms: int,
              should_stop: Callable[[], bool] | None = None) -> list[Delivered]:
        """``receive`` as leased spans and their stored rows, for the caller to shape."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._cond:
                while True:
                    seq = self._wake_seq  # before looking: a change after it ends the wait
                    self._check_open_locked()
                    stream_log = self._log_source()
                    now = self._clock()
                    self._table.touch(member, now)
                    self._follow_log_locked(stream_log)
                    dead = self._table.expire(now)
                    if dead:
                        break  # dead-letter outside the lock, then look again
                    out = self._lease_locked(stream_log, member, max_messages, now,
                                             ack_wait_ms, LEASE_MAX_BYTES)
                    if out:
                        self._metrics.deliveries.inc(sum(d.size for d in out))
                        again = sum(d.size for d in out if d.attempt > 1)
                        if again:
                            self._metrics.redeliveries.inc(again)
                        return out
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or (should_stop is not None and should_stop()):
                        return []
                    remaining = min(remaining, LONG_POLL_SLICE_S)
                    due = self._table.next_due_ms()
                    if due is not None:
                        remaining = min(remaining, max(0.001, (due - now) / 1000))
                    self._wait_locked(stream_log, remaining, seq)
                    if should_stop is not None and should_stop():
                        return []  # gone while it waited: lease nothing to a call nobody reads
            self._dead_letter(dead)

    def _wait_locked(self, stream_log: StreamLog, timeout: float, seq: int) -> None:
        """Sleep (group lock released) until _wake_seq moves past seq or timeout."""
        if self._listening is not stream_log:
            # Appends from now on bump _wake_seq; one made since the caller looked is
            # found by its next look, so return to it instead of waiting.
            if self._listening is not None:
                self._listening.remove_append_listener(self._bump)
            stream_log.add_append_listener(self._bump)
            self._listening = stream_log
            return
        self._cond.release()
        try:
            with self._wake:
                self._waiters += 1
                try:
                    self._wake.wait_for(lambda: self._wake_seq != seq, timeout)
                finally:
                    self._waiters -= 1
        finally:
            self._cond.acquire()

    def wake(self) -> None:
        """Wake waiting receives so they re-check should_stop."""
        with self._cond:
            self._changed_locked()

    # ------------------------------------------------------------ finishing

    def ack(self, offsets: list[int], member: str | None,
            ranges: Sequence[tuple[int, int]] = (), *, waited: bool = True,
            ) -> tuple[int, int, int]:
        """(acked count, committed offset, writer ticket for durability).

        ``ranges``: ``[start, end)`` runs acked as well (a batch acked whole).
        ``waited=False``: nobody waits for the ticket (acks on a Subscribe
        stream); the writer thread writes the position within its interval.
        """
        with self._cond:
            self._check_open_locked()
            blocked = self._fresh_budget_locked() <= 0
            now = self._clock()
            runs = finish_runs(offsets, ranges)
            count = self._table.ack_runs(runs, member, now)
            self._release_keys_locked(runs, count)
            if not self._table.unfinished:
                self._fresh.forget_read()  # nothing to redeliver: free the last read
            if count:
                # Pop the acked leases' expiry entries now, while the heap is small,
                # instead of a second's worth in one upkeep pass (a stall under the lock).
                self._table.next_due_ms()
                self._metrics.acks.inc(count)
                if blocked:
                    # The fresh budget grew from nothing: waiters may deliver again. An
                    # ack wakes nobody otherwise (a waiter with budget waits for data,
                    # and an ack makes no redelivery due sooner): a wake-up per ack
                    # would cost the Subscribe senders a spurious look under the lock.
                    self._changed_locked()
            return count, self._table.committed, self._persist_locked(waited)

    def nack(self, offsets: list[int], member: str | None, delay_ms: int,
             ranges: Sequence[tuple[int, int]] = ()) -> int:
        """Release leases for redelivery; dead-letters those out of attempts."""
        with self._cond:
            self._check_open_locked()
            count, dead = self._table.nack_runs(finish_runs(offsets, ranges), member,
                                                delay_ms, self._clock())
            if count:
                self._metrics.nacks.inc(count)
                self._changed_locked()
        self._dead_letter(dead)
        return count

    def _dead_letter(self, spans: list[Span]) -> None:
        """Copy the messages of ``spans`` (out of attempts) to the dead-letter stream."""
        if not spans:
            return
        target = self.config.dead_letter_stream
        try:
            letters = self._letters(spans)
            self._dead_letters.write(self.stream, self.group, target, letters)
        except Exception as exc:
            log.error("dead-letter write of %d message(s) from stream '%s' (group '%s') to "
                      "'%s' failed, redelivering them in %d ms: %s",
                      sum(s.count for s in spans), self.stream, self.group, target,
                      DEAD_LETTER_RETRY_MS, exc)
            with self._cond:
                retry_at = self._clock() + DEAD_LETTER_RETRY_MS
                for span in spans:
                    self._table.dead_letter_failed(span.start, span.end, retry_at)
                self._changed_locked()
            return
        self._metrics.dead_letters.inc(len(letters))
        with self._cond:
            for span in spans:
                self._dead_lettered += self._table.dead_lettered(span.start, span.end)
            self._release_keys_locked([(span.start, span.end) for span in spans])
            ticket = self._persist_locked()
            self._changed_locked()
        self._writer.wait(ticket)

    def _letters(self, spans: list[Span]) -> list[DeadLetter]:
        """The messages of ``spans`` as read from the log (those it no longer has are skipped)."""
        stream_log = self._log_source()
        letters: list[DeadLetter] = []
        for span in spans:
            try:
                with self._cond:
                    parts = read_span(stream_log, span.start, span.end)
            except OffsetOutOfRangeError:
                continue
            for part in parts:
                rows = part if isinstance(part, list) else rows_from_batch(part)
                letters += [DeadLetter(row, span.attempt, span.failure) for row in rows]
        return letters

    # ------------------------------------------------------------ upkeep and admin

    def tick(self) -> None:
        """Expire leases, dead-letter what ran out, follow retention, forget idle members."""
        with self._cond:
            if self._closed is not None:
                return
            try:
                stream_log = self._log_source()
            except BrokerError:
                return
            now = self._clock()
            self._follow_log_locked(stream_log)
            dead = self._table.expire(now)
            self._table.forget_idle_members(now, max(MEMBER_IDLE_MS, 2 * self.config.ack_wait_ms))
            if not self._table.unfinished:
                self._fresh.forget_read()
            if self._table.next_due_ms() is not None:
                self._changed_locked()  # redeliveries may be due for waiting members
            self._persist_locked()
        self._dead_letter(dead)

    def snapshot(self) -> SharedSnapshot:
        self.tick()
        with self._cond:
            now = self._clock()
            members = [
                MemberInfo(m, now if s.connections else s.last_seen_ms, s.in_flight,
                           s.connections)
                for m, s in sorted(self._table.members.items())
            ]
            return SharedSnapshot(
                committed_offset=self._table.committed,
                in_flight=self._table.in_flight,
                pending=self._table.unfinished,
                dead_lettered=self._dead_lettered,
                members=members,
                config=self._table.config,
            )

    def update_config(self, config: SharedConfig) -> None:
        with self._cond:
            was_keyed = self._table.config.ordering == "key"
            self._table.config = config
            if was_keyed and config.ordering != "key":
                # Unordered now: nothing waits for its key any more.
                released = self._table.release_all_held(self._clock())
                self._keys.clear()
                self._released.clear()
                log.info("group '%s' on stream '%s' is no longer ordered by key: %d held "
                         "message(s) released", self.group, self.stream, released)
                self._changed_locked()

    def seek(self, offset: int) -> int:
        """Restart delivery at offset, dropping every lease; returns the writer ticket."""
        with self._cond:
            self._check_open_locked()
            dropped = self._reset_locked(offset)
            log.info("group '%s' on stream '%s' moved to offset %d; %d unfinished "
                     "deliveries dropped", self.group, self.stream, offset, dropped)
            return self._persist_locked()

    def connect(self, member: str) -> None:
        with self._cond:
            self._table.touch(member, self._clock()).connections += 1

    def disconnect(self, member: str) -> None:
        with self._cond:
            state = self._table.touch(member, self._clock())
            state.connections = max(0, state.connections - 1)

    def close(self, reason: BrokerError) -> None:
        """Fail current and future calls with reason (group or stream deleted)."""
        with self._cond:
            self._closed = reason
            if self._listening is not None:
                self._listening.remove_append_listener(self._bump)
                self._listening = None
            self._changed_locked()

"""In-flight bookkeeping of one shared group, as offset ranges: leases, redeliveries, acks.

Pure data structure, no I/O and no clock of its own (every method takes
``now_ms``), so expiry, backoff and dead-letter decisions are tested exactly.
The caller (SharedGroup) holds its lock around every call.

State is kept per *span*, a run of consecutive offsets in one state with one
attempt count, holder and deadline, as Kafka's share groups keep it per
acquired batch: a batch of 1,000 deliveries is one span, leased with one heap
entry and finished by one ack of its range, where a record per message would cost
the broker a Python object, a heap entry and a dict slot each. A span is split only where a partial
ack, nack or expiry makes its parts differ. The rows themselves are not kept:
a redelivery reads them from the log again.

Every offset in ``[committed, next_fresh)`` is either in exactly one span or
finished (acked or dead-lettered). A span is

* ``LEASED``: delivered to ``member`` until ``expires_ms``;
* ``WAITING``: to be delivered again from ``ready_ms`` on;
* ``DEAD_LETTERING``: out of attempts, being copied to the dead-letter stream;
* ``HELD``: read but not delivered yet, because an earlier message with the
  same key is unfinished (a group ordered by key, shared.py); leased straight
  from this state when its turn comes (``lease_held``). Never acked.

So ``committed``, the lowest offset not finished, is the first span's start
(or ``next_fresh`` when nothing is unfinished), and finished offsets above it
cost nothing. Offsets below the stream's start (retention, delete_before) are
dropped with ``drop_below`` and never block it.

Two heaps order the work: lease expiries and redelivery times, one entry per
span. Entries are never removed in place: each span carries a version,
renewed on every change, and stale entries are skipped when popped.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator
from copy import copy
from dataclasses import dataclass, field

from npstream.broker.groups.shared_config import SharedConfig
from npstream.broker.storage.results import StoredRow

__all__ = ["DEAD_LETTERING", "HELD", "LEASED", "WAITING", "DeliveryRow", "LeaseTable",
           "MemberState", "Span", "finish_runs", "merged_runs", "offset_runs"]

# One message as handed to a member: the storage's row type, so rows the log hands
# over as Python values (StreamLog.recent_rows) need no conversion.
DeliveryRow = StoredRow

LEASED = "leased"
WAITING = "waiting"
DEAD_LETTERING = "dead_lettering"
HELD = "held"
_ACKABLE = (LEASED, WAITING)  # an ack finishes these (see ack_runs)


@dataclass(slots=True)
class Span:
    """Delivered, unfinished offsets ``[start, end)`` sharing one state (module doc)."""

    start: int
    end: int
    state: str
    attempt: int  # deliveries so far (1 after the first)
    member: str | None = None  # holder while leased
    expires_ms: int = 0  # lease end, while leased
    ready_ms: int = 0  # earliest redelivery, while waiting
    version: int = 0
    failure: str = ""  # how the last attempt ended: "nack" or "expired"

    @property
    def count(self) -> int:
        return self.end - self.start


@dataclass(slots=True)
class MemberState:
    """What DescribeGroup reports per member."""

    last_seen_ms: int
    in_flight: int = 0
    connections: int = 0  # open Subscribe calls


def offset_runs(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, merged ``[start, end)`` runs of the given offsets (duplicates ignored)."""
    runs: list[tuple[int, int]] = []
    for offset in sorted(set(offsets)):
        if runs and runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], offset + 1)
        else:
            runs.append((offset, offset + 1))
    return runs


def merged_runs(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged runs of ``[start, end)`` ranges (empty ones dropped)."""
    runs: list[tuple[int, int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if runs and start <= runs[-1][1]:
            runs[-1] = (runs[-1][0], max(runs[-1][1], end))
        else:
            runs.append((start, end))
    return runs


def finish_runs(offsets: Iterable[int],
                ranges: Iterable[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """What an ack or a nack names, single offsets and ``[start, end)`` ranges, as the
    sorted, merged runs ``ack_runs`` and ``nack_runs`` take."""
    runs = offset_runs(offsets)
    ranges = list(ranges)
    return merged_runs([*runs, *ranges]) if ranges else runs


@dataclass
class LeaseTable:
    """See the module docstring; ``config`` may be replaced between calls."""

    initial_committed: int
    config: SharedConfig
    next_fresh: int = -1  # next offset never delivered; starts at the committed offset
    members: dict[str, MemberState] = field(default_factory=dict)
    _spans: dict[int, Span] = field(default_factory=dict)  # by start
    _starts: list[int] = field(default_factory=list)  # sorted starts of _spans
    _unfinished: int = 0  # offsets in spans
    _version: int = 0
    _expiry: list[tuple[int, int, int]] = field(default_factory=list)  # (expires, start, ver)
    _ready: list[tuple[int, int, int]] = field(default_factory=list)  # (ready, start, ver)

    def __post_init__(self) -> None:
        if self.next_fresh < self.initial_committed:
            self.next_fresh = self.initial_committed

    # ------------------------------------------------------------ counts

    @property
    def committed(self) -> int:
        """The lowest offset not finished."""
        return self._starts[0] if self._starts else self.next_fresh

    @property
    def in_flight(self) -> int:
        """Leased, unfinished deliveries."""
        return sum(m.in_flight for m in self.members.values())

    @property
    def unfinished(self) -> int:
        """Delivered messages not yet acked or dead-lettered."""
        return self._unfinished

    def fresh_budget(self, max_pending: int, max_window: int) -> int:
        """How many never-delivered messages may be handed out now."""
        return max(0, min(max_pending - self._unfinished,
                          max_window - (self.next_fresh - self.committed)))

    def spans(self) -> Iterator[Span]:
        """Every span, in offset order (for inspection and tests)."""
        return (self._spans[start] for start in list(self._starts))

    def spans_in(self, lo: int, hi: int) -> list[Span]:
        """The spans holding any offset of ``[lo, hi)``, in offset order."""
        return self._overlapping(lo, hi, (LEASED, WAITING, DEAD_LETTERING, HELD))

    def span_at(self, offset: int) -> Span | None:
        """The span holding ``offset``, None when it is finished or never delivered."""
        i = bisect_right(self._starts, offset) - 1
        if i >= 0:
            span = self._spans[self._starts[i]]
            if span.end > offset:
                return span
        return None

    # ------------------------------------------------------------ members

    def touch(self, member: str, now_ms: int) -> MemberState:
        state = self.members.get(member)
        if state is None:
            state = self.members[member] = MemberState(last_seen_ms=now_ms)
        state.last_seen_ms = max(state.last_seen_ms, now_ms)
        return state

    def forget_idle_members(self, now_ms: int, idle_ms: int) -> list[str]:
        """Drop members with no leases, no connection and not seen for idle_ms."""
        gone = [m for m, s in self.members.items()
                if not s.in_flight and not s.connections and now_ms - s.last_seen_ms >= idle_ms]
        for member in gone:
            del self.members[member]
        return gone

    # ------------------------------------------------------------ span plumbing

    def _new_version(self) -> int:
        self._version += 1
        return self._version

    def _insert(self, span: Span) -> None:
        self._spans[span.start] = span
        insort(self._starts, span.start)

    def _remove(self, span: Span) -> None:
        del self._spans[span.start]
        del self._starts[bisect_left(self._starts, span.start)]
        self._unfinished -= span.end - span.start
        if span.state == LEASED:
            self._release_member(span)

    def _release_member(self, span: Span) -> None:
        if span.member is not None:
            state = self.members.get(span.member)
            if state is not None:
                state.in_flight = max(0, state.in_flight - (span.end - span.start))
            span.member = None

    def _schedule(self, span: Span) -> None:
        if span.state == LEASED:
            heapq.heappush(self._expiry, (span.expires_ms, span.start, span.version))
        elif span.state == WAITING:
            heapq.heappush(self._ready, (span.ready_ms, span.start, span.version))

    def _live(self, start: int, version: int, state: str) -> Span | None:
        span = self._spans.get(start)
        if span is None or span.version != version or span.state != state:
            return None
        return span

    def _carve(self, span: Span, lo: int, hi: int) -> Span:
        """``span``'s offsets ``[lo, hi)`` as a span of their own; the rest keeps its state.

        The part left of ``lo`` keeps the span (and its heap entry); the part
        right of ``hi`` is a new span with the same state and deadline, and
        the returned middle part is new unless it starts the span. The
        caller changes the returned span's state (or removes it).
        """
        if hi < span.end:
            right = Span(hi, span.end, span.state, span.attempt, span.member, span.expires_ms,
                         span.ready_ms, self._new_version(), span.failure)
            span.end = hi
            self._insert(right)
            self._schedule(right)
        if lo > span.start:
            middle = Span(lo, span.end, span.state, span.attempt, span.member,
                          span.expires_ms, span.ready_ms, self._new_version(), span.failure)
            span.end = lo
            self._insert(middle)
            return middle
        return span

    def _overlapping(self, lo: int, hi: int, states: tuple[str, ...]) -> list[Span]:
        """Spans in ``states`` that hold any offset of ``[lo, hi)``, in offset order."""
        out: list[Span] = []
        i = max(0, bisect_right(self._starts, lo) - 1)
        starts = self._starts
        while i < len(starts) and starts[i] < hi:
            span = self._spans[starts[i]]
            if span.end > lo and span.state in states:
                out.append(span)
            i += 1
        return out

    # ------------------------------------------------------------ delivering

    def _lease(self, span: Span, member: str, now_ms: int, ack_wait_ms: int) -> None:
        span.state = LEASED
        span.attempt += 1
        span.member = member
        span.expires_ms = now_ms + ack_wait_ms
        span.version = self._new_version()
        self.touch(member, now_ms).in_flight += span.count
        self._schedule(span)

    def lease_ready(self, member: str, now_ms: int, ack_wait_ms: int,
                    limit: int) -> list[Span]:
        """Lease up to ``limit`` messages whose redelivery time has come, oldest first.

        A waiting span larger than what is left of ``limit`` is split: its
        first part is leased, the rest keeps waiting.
        """
        out: list[Span] = []
        taken = 0
        while self._ready and taken < limit and self._ready[0][0] <= now_ms:
            _ready, start, version = heapq.heappop(self._ready)
            span = self._live(start, version, WAITING)
            if span is None:
                continue
            if span.count > limit - taken:
                span = self._carve(span, span.start, span.start + limit - taken)
            self._lease(span, member, now_ms, ack_wait_ms)
            out.append(span)
            taken += span.count
        return out

    def take_fresh(self, member: str, runs: Iterable[tuple[bool, int]], now_ms: int,
                   ack_wait_ms: int) -> list[Span | None]:
        """Consecutive runs of never-delivered offsets from ``next_fresh``, one span each:
        leased to ``member`` (True) or HELD (False, ordering by key); None for an empty run.

        In one loop, because with ordering="key" and keys that repeat a batch of
        1,000 is ~100 runs, and a call per run was a good part of its cost.
        """
        out: list[Span | None] = []
        first = start = self.next_fresh
        expires = now_ms + ack_wait_ms
        leased = 0
        spans, starts, expiry = self._spans, self._starts, self._expiry
        for deliver, count in runs:
            if count <= 0:
                out.append(None)
                continue
            self._version += 1
            if deliver:
                span = Span(start, start + count, LEASED, 1, member, expires, 0, self._version)
                heapq.heappush(expiry, (expires, start, self._version))
                leased += count
            else:
                span = Span(start, start + count, HELD, 0, version=self._version)
            spans[start] = span
            starts.append(start)  # fresh offsets lie past every span: the list stays sorted
            out.append(span)
            start += count
        self._unfinished += start - first
        if leased:
            self.touch(member, now_ms).in_flight += leased
        self.next_fresh = start
        return out

    def lease_held(self, member: str, offsets: Iterable[int], now_ms: int,
                   ack_wait_ms: int) -> list[Span]:
        """Lease HELD offsets whose turn came (ordering by key), one span each, in the
        order given; an offset no longer held (retention, a seek) is skipped.

        Straight from HELD to LEASED, not through WAITING and the ready heap: a
        released offset is due at once, and with keys that repeat a few percent
        of a batch is released on every ack, each a heap entry made and popped for
        nothing.
        """
        out: list[Span] = []
        for offset in offsets:
            span = self.span_at(offset)
            if span is None or span.state != HELD:
                continue
            if span.count > 1:
                span = self._carve(span, offset, offset + 1)
            self._lease(span, member, now_ms, ack_wait_ms)
            out.append(span)
        return out

    def release_all_held(self, now_ms: int) -> int:
        """Every HELD span due now (ordering switched off); returns how many offsets."""
        count = 0
        for span in [s for s in self._spans.values() if s.state == HELD]:
            span.state = WAITING
            span.ready_ms = now_ms
            span.version = self._new_version()
            self._schedule(span)
            count += span.count
        return count

    # ------------------------------------------------------------ finishing

    def ack_runs(self, runs: list[tuple[int, int]], member: str | None, now_ms: int) -> int:
        """Finish the offsets of ``runs`` (``finish_runs``); returns how many were delivered
        and unfinished.

        An ack is accepted from any member, even after the lease expired: the
        work was done, so redelivering it again would only repeat it.
        """
        if member is not None:
            self.touch(member, now_ms)
        count = 0
        for lo, hi in runs:
            span = self._spans.get(lo)
            if span is not None and span.end == hi and span.state in _ACKABLE:
                self._remove(span)  # the common case: a run of the ack is one span
                count += hi - lo
                continue
            for span in self._overlapping(lo, hi, _ACKABLE):
                piece = self._carve(span, max(lo, span.start), min(hi, span.end))
                self._remove(piece)
                count += piece.count
        return count

    def _fail(self, span: Span, now_ms: int, delay_ms: int, how: str) -> Span | None:
        """After a failed attempt: schedule a redelivery, or return the span for dead-lettering."""
        span.failure = how
        span.version = self._new_version()
        if self.config.exhausted(span.attempt):
            span.state = DEAD_LETTERING
            return span
        span.state = WAITING
        span.ready_ms = now_ms + max(delay_ms, self.config.backoff_after(span.attempt))
        self._schedule(span)
        return None

    def nack_runs(self, runs: list[tuple[int, int]], member: str | None,
                  delay_ms: int, now_ms: int) -> tuple[int, list[Span]]:
        """Release the leases in ``runs`` (``finish_runs``) for redelivery after
        max(delay, backoff).

        Only leases held by ``member`` (any holder when None) are released, so
        a member whose lease expired cannot disturb the next holder. Returns
        (released count, spans out of attempts that must be dead-lettered: copies,
        so their ranges stay what they were when retention cuts the table's).
        """
        if member is not None:
            self.touch(member, now_ms)
        count = 0
        dead: list[Span] = []
        for lo, hi in runs:
            for span in self._overlapping(lo, hi, (LEASED,)):
                if member is not None and span.member != member:
                    continue
                piece = self._carve(span, max(lo, span.start), min(hi, span.end))
                self._release_member(piece)
                count += piece.count
                out = self._fail(piece, now_ms, delay_ms, "nack")
                if out is not None:
                    dead.append(copy(out))
        return count, dead

    def expire(self, now_ms: int) -> list[Span]:
        """Release every lease that ended by now_ms; returns the spans out of attempts."""
        dead: list[Span] = []
        while self._expiry and self._expiry[0][0] <= now_ms:
            expires, start, version = heapq.heappop(self._expiry)
            span = self._live(start, version, LEASED)
            if span is None:
                continue
            self._release_member(span)
            out = self._fail(span, expires, 0, "expired")
            if out is not None:
                dead.append(copy(out))
        return dead

    def dead_lettered(self, start: int, end: int) -> int:
        """The dead-letter copies of ``[start, end)`` are stored: those offsets are done.

        Ranges, not span objects: retention may have cut a span meanwhile.
        Returns how many offsets were still being dead-lettered.
        """
        count = 0
        for span in self._overlapping(start, end, (DEAD_LETTERING,)):
            piece = self._carve(span, max(start, span.start), min(end, span.end))
            self._remove(piece)
            count += piece.count
        return count

    def dead_letter_failed(self, start: int, end: int, retry_at_ms: int) -> None:
        """The copy could not be stored: deliver ``[start, end)`` again at retry_at_ms.

        The attempt count stays at the limit, so if that delivery fails too
        the copy is tried again; the message is never lost or silently dropped.
        """
        for span in self._overlapping(start, end, (DEAD_LETTERING,)):
            piece = self._carve(span, max(start, span.start), min(end, span.end))
            piece.state = WAITING
            piece.ready_ms = retry_at_ms
            piece.version = self._new_version()
            self._schedule(piece)

    # ------------------------------------------------------------ schedule

    def next_due_ms(self) -> int | None:
        """Earliest time a lease expires or a redelivery becomes ready, None if never."""
        while self._expiry and self._live(self._expiry[0][1], self._expiry[0][2],
                                          LEASED) is None:
            heapq.heappop(self._expiry)
        while self._ready and self._live(self._ready[0][1], self._ready[0][2],
                                         WAITING) is None:
            heapq.heappop(self._ready)
        times = [h[0][0] for h in (self._expiry, self._ready) if h]
        return min(times) if times else None

    # ------------------------------------------------------------ deletions

    def drop_below(self, start: int) -> int:
        """Forget offsets below ``start`` (removed from the log); returns how many were pending."""
        dropped = 0
        while self._starts and self._starts[0] < start:
            span = self._spans[self._starts[0]]
            piece = self._carve(span, span.start, min(start, span.end))
            self._remove(piece)
            dropped += piece.count
        if self.next_fresh < start:
            self.next_fresh = start
        return dropped

    def reset(self, offset: int) -> int:
        """Seek: forget every delivery and start again at offset; returns leases dropped."""
        dropped = self._unfinished
        for span in list(self._spans.values()):
            if span.state == LEASED:
                self._release_member(span)
        self._spans.clear()
        self._starts.clear()
        self._unfinished = 0
        self._expiry.clear()
        self._ready.clear()
        self.next_fresh = offset
        return dropped

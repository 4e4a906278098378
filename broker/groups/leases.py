"""In-flight bookkeeping of one shared group: leases, redelivery times, acks, the committed offset.

Pure data structure, no I/O and no clock of its own (every method takes
``now_ms``), so expiry, backoff and dead-letter decisions are tested exactly.
The caller (SharedGroup) holds its lock around every call.

Every offset in ``[committed, next_fresh)`` is in exactly one of:

* ``pending``: delivered and not finished, either *leased* (held by a member
  until ``expires_ms``) or *waiting* for a redelivery at ``ready_ms``;
* ``done``: acked (or dead-lettered) above the committed offset;
* ``dead_lettering``: out of attempts, being copied to the dead-letter stream.

``committed`` is the lowest offset not finished; it moves up as soon as the
offsets right above it are done, which is what makes the pending count reach
zero and the group's lag honest. Offsets below the stream's start (retention,
delete_before) are dropped with ``drop_below`` and never block it.

Two heaps order the work: lease expiries and redelivery times. Entries are
never removed from a heap in place: each pending entry carries a version
bumped on every change, and stale heap items are skipped when popped.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from npstream.broker.groups.shared_config import SharedConfig
from npstream.broker.storage.results import StoredRow

__all__ = ["DeliveryRow", "LeaseTable", "MemberState", "Pending"]


# One message as handed to a member: the storage's row type, so rows the log hands
# over as Python values (StreamLog.recent_rows) need no conversion.
DeliveryRow = StoredRow


@dataclass(slots=True)
class Pending:
    """A delivered, unfinished message."""

    row: DeliveryRow
    attempt: int = 0  # deliveries so far (1 after the first)
    member: str | None = None  # holder while leased, None while waiting
    expires_ms: int = 0  # lease end, when leased
    ready_ms: int = 0  # earliest redelivery, when waiting
    version: int = 0
    failure: str = ""  # how the last attempt ended: "nack" or "expired"

    @property
    def offset(self) -> int:
        return self.row.offset


@dataclass(slots=True)
class MemberState:
    """What DescribeGroup reports per member."""

    last_seen_ms: int
    in_flight: int = 0
    connections: int = 0  # open Subscribe calls


@dataclass
class LeaseTable:
    """See the module docstring; ``config`` may be replaced between calls."""

    committed: int
    config: SharedConfig
    next_fresh: int = -1  # next offset never delivered; starts at committed
    pending: dict[int, Pending] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    dead_lettering: dict[int, Pending] = field(default_factory=dict)
    members: dict[str, MemberState] = field(default_factory=dict)
    _expiry: list[tuple[int, int, int]] = field(default_factory=list)  # (expires, offset, ver)
    _ready: list[tuple[int, int, int]] = field(default_factory=list)  # (ready, offset, ver)

    def __post_init__(self) -> None:
        if self.next_fresh < self.committed:
            self.next_fresh = self.committed

    # ------------------------------------------------------------ counts

    @property
    def in_flight(self) -> int:
        """Leased, unfinished deliveries."""
        return sum(m.in_flight for m in self.members.values())

    @property
    def unfinished(self) -> int:
        """Delivered messages not yet acked or dead-lettered."""
        return len(self.pending) + len(self.dead_lettering)

    def fresh_budget(self, max_pending: int, max_window: int) -> int:
        """How many never-delivered messages may be handed out now."""
        return max(0, min(max_pending - self.unfinished,
                          max_window - (self.next_fresh - self.committed)))

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

    # ------------------------------------------------------------ delivering

    def _lease(self, entry: Pending, member: str, now_ms: int, ack_wait_ms: int) -> None:
        entry.attempt += 1
        entry.member = member
        entry.expires_ms = now_ms + ack_wait_ms
        entry.version += 1
        self.touch(member, now_ms).in_flight += 1
        heapq.heappush(self._expiry, (entry.expires_ms, entry.offset, entry.version))

    def _unlease(self, entry: Pending) -> None:
        if entry.member is not None:
            state = self.members.get(entry.member)
            if state is not None and state.in_flight > 0:
                state.in_flight -= 1
            entry.member = None
        entry.version += 1

    def lease_ready(self, member: str, now_ms: int, ack_wait_ms: int,
                    limit: int) -> list[Pending]:
        """Lease up to ``limit`` messages whose redelivery time has come, oldest first."""
        out: list[Pending] = []
        while self._ready and len(out) < limit and self._ready[0][0] <= now_ms:
            _ready, offset, version = heapq.heappop(self._ready)
            entry = self.pending.get(offset)
            if entry is None or entry.version != version or entry.member is not None:
                continue
            self._lease(entry, member, now_ms, ack_wait_ms)
            out.append(entry)
        return out

    def lease_fresh(self, member: str, rows: list[DeliveryRow], now_ms: int,
                    ack_wait_ms: int) -> list[Pending]:
        """Lease never-delivered rows; they must start at ``next_fresh`` in offset order."""
        if rows and rows[0].offset < self.next_fresh:
            raise ValueError(
                f"fresh row offset {rows[0].offset} is below next_fresh {self.next_fresh}"
            )
        # _lease() for a batch of first attempts: one member update, no call per row.
        expires = now_ms + ack_wait_ms
        out = [Pending(row, 1, member, expires, 0, 1) for row in rows]
        pending, expiry, push = self.pending, self._expiry, heapq.heappush
        for entry in out:
            offset = entry.row.offset
            pending[offset] = entry
            push(expiry, (expires, offset, 1))
        if out:
            self.touch(member, now_ms).in_flight += len(out)
            self.next_fresh = out[-1].row.offset + 1
        return out

    # ------------------------------------------------------------ finishing

    def _advance(self) -> None:
        while self.committed in self.done:
            self.done.remove(self.committed)
            self.committed += 1
        if self.committed > self.next_fresh:  # only after drop_below/seek
            self.next_fresh = self.committed

    def _finish(self, offset: int) -> None:
        if offset > self.committed:
            self.done.add(offset)
        elif offset == self.committed:
            self.committed += 1
            self._advance()

    def ack(self, offsets: list[int], member: str | None, now_ms: int) -> int:
        """Finish the given offsets; returns how many were delivered and unfinished.

        An ack is accepted from any member, even after the lease expired: the
        work was done, so redelivering it again would only repeat it.
        """
        if member is not None:
            self.touch(member, now_ms)
        count = 0
        for offset in offsets:
            entry = self.pending.pop(offset, None)
            if entry is None:
                continue
            self._unlease(entry)
            self._finish(offset)
            count += 1
        return count

    def _fail(self, entry: Pending, now_ms: int, delay_ms: int, how: str) -> Pending | None:
        """After a failed attempt: schedule a redelivery, or return entry for dead-lettering."""
        entry.failure = how
        if self.config.exhausted(entry.attempt):
            del self.pending[entry.offset]
            self.dead_lettering[entry.offset] = entry
            return entry
        entry.ready_ms = now_ms + max(delay_ms, self.config.backoff_after(entry.attempt))
        heapq.heappush(self._ready, (entry.ready_ms, entry.offset, entry.version))
        return None

    def nack(self, offsets: list[int], member: str | None, delay_ms: int,
             now_ms: int) -> tuple[int, list[Pending]]:
        """Release leases for redelivery after max(delay, backoff).

        Only leases held by ``member`` (any holder when None) are released, so
        a member whose lease expired cannot disturb the next holder. Returns
        (released count, entries out of attempts that must be dead-lettered).
        """
        if member is not None:
            self.touch(member, now_ms)
        count = 0
        dead: list[Pending] = []
        for offset in offsets:
            entry = self.pending.get(offset)
            if entry is None or entry.member is None:
                continue
            if member is not None and entry.member != member:
                continue
            self._unlease(entry)
            count += 1
            out = self._fail(entry, now_ms, delay_ms, "nack")
            if out is not None:
                dead.append(out)
        return count, dead

    def expire(self, now_ms: int) -> list[Pending]:
        """Release every lease that ended by now_ms; returns those out of attempts."""
        dead: list[Pending] = []
        while self._expiry and self._expiry[0][0] <= now_ms:
            expires, offset, version = heapq.heappop(self._expiry)
            entry = self.pending.get(offset)
            if entry is None or entry.version != version or entry.member is None:
                continue
            self._unlease(entry)
            out = self._fail(entry, expires, 0, "expired")
            if out is not None:
                dead.append(out)
        return dead

    def dead_lettered(self, offset: int) -> bool:
        """The dead-letter copy of offset is stored: it counts as done."""
        if self.dead_lettering.pop(offset, None) is None:
            return False
        self._finish(offset)
        return True

    def dead_letter_failed(self, offset: int, retry_at_ms: int) -> None:
        """The copy could not be stored: deliver it again at retry_at_ms.

        Its attempt count stays at the limit, so if that delivery fails too the
        copy is tried again; the message is never lost or silently dropped.
        """
        entry = self.dead_lettering.pop(offset, None)
        if entry is None:
            return
        self.pending[offset] = entry
        entry.version += 1
        entry.ready_ms = retry_at_ms
        heapq.heappush(self._ready, (retry_at_ms, offset, entry.version))

    # ------------------------------------------------------------ schedule

    def next_due_ms(self) -> int | None:
        """Earliest time a lease expires or a redelivery becomes ready, None if never."""
        while self._expiry:
            _t, offset, version = self._expiry[0]
            entry = self.pending.get(offset)
            if entry is not None and entry.version == version and entry.member is not None:
                break
            heapq.heappop(self._expiry)
        while self._ready:
            _t, offset, version = self._ready[0]
            entry = self.pending.get(offset)
            if entry is not None and entry.version == version and entry.member is None:
                break
            heapq.heappop(self._ready)
        times = [h[0][0] for h in (self._expiry, self._ready) if h]
        return min(times) if times else None

    # ------------------------------------------------------------ deletions

    def drop_below(self, start: int) -> int:
        """Forget offsets below ``start`` (removed from the log); returns how many were pending."""
        if start <= self.committed:
            return 0
        dropped = 0
        for offset in [o for o in self.pending if o < start]:
            self._unlease(self.pending.pop(offset))
            dropped += 1
        for offset in [o for o in self.dead_lettering if o < start]:
            del self.dead_lettering[offset]
            dropped += 1
        self.done = {o for o in self.done if o >= start}
        self.committed = start
        self._advance()
        return dropped

    def reset(self, offset: int) -> int:
        """Seek: forget every delivery and start again at offset; returns leases dropped."""
        dropped = self.unfinished
        for entry in self.pending.values():
            self._unlease(entry)
        self.pending.clear()
        self.dead_lettering.clear()
        self.done.clear()
        self._expiry.clear()
        self._ready.clear()
        self.committed = self.next_fresh = offset
        return dropped

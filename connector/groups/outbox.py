"""Request coalescing for push subscriptions: acks, nacks and credits sent together.

Why: one gRPC stream message per ack and per freed credit is what limits a
Python consumer, so a subscription does not send them as they happen. It
puts them in the ``Outbox`` of its current call, and the call's request
iterator (run by gRPC's sender thread) sends everything that piled up as one
SubscribeRequest once enough has piled up or a short timer ran out. The
broker does the same in the other direction (one DeliveryBatch per send).

An outbox belongs to one Subscribe call: once the call is closed it refuses
new items, and the subscription settles those leases with unary calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from npstream.groups.batch import offset_ranges
from npstream.groups.leases import LEASE_OFFSET
from npstream.proto import pb

if TYPE_CHECKING:
    from npstream.client.connection import StreamingCall
    from npstream.groups.leases import Lease, Settle
    from npstream.groups.subscription import SubscriptionCounters

__all__ = ["ACK_FLUSH_INTERVAL_S", "ACK_FLUSH_MAX", "CREDIT_BATCH_DIVISOR", "Outbox"]

# ---------------------------------------------------------------- tuning
# Coalescing of what a subscription sends back on its stream (acks, nacks and
# the credits their handlers freed): one SubscribeRequest carries everything
# settled since the previous one. It is sent ACK_FLUSH_INTERVAL_S after the
# first unsent item at the latest, so a lone message is acked within a few
# ms; sooner when max_in_flight // CREDIT_BATCH_DIVISOR credits are free (so
# a busy subscription does not wait for the timer, and the broker is not left
# without credits while the rest of a batch is handled) or ACK_FLUSH_MAX
# acks/nacks are pending (bounds the request size). Half the window, not a
# quarter: the broker then sends batches of ~max_in_flight/2, and each batch
# costs both sides a fixed share (a gRPC message each way, an Arrow stream,
# thread wake-ups); with fast handlers a quarter-window batch cost ~8% more
# client CPU per message, and the other half of the window still keeps the
# handlers busy while the next batch comes.
ACK_FLUSH_INTERVAL_S = 0.002
CREDIT_BATCH_DIVISOR = 2
ACK_FLUSH_MAX = 1000


def _ack_ranges(acks: list[int]) -> list[tuple[int, int]]:
    """Acked offsets as ``[start, end)`` runs; usually one (a window acked in order)."""
    if not acks:
        return []
    acks.sort()  # nearly sorted already: linear
    if acks == list(range(acks[0], acks[-1] + 1)):  # one run, checked exactly (no duplicate)
        return [(acks[0], acks[-1] + 1)]
    return offset_ranges(np.array(acks, dtype=np.int64))


class Outbox:
    """One Subscribe call: an outbox of acks, nacks and credits, and the response iterator.

    The request iterator (run by gRPC's sender thread) sends whatever piled up
    as one request (plus one per further nack delay) once the outbox is due:
    ``credit_batch`` credits or ACK_FLUSH_MAX acks/nacks are waiting, or the
    oldest item has waited ACK_FLUSH_INTERVAL_S, or the call is closing.
    """

    def __init__(self, opening: pb.SubscribeRequest, credit_batch: int,
                 counters: SubscriptionCounters, lock: threading.Lock | None = None,
                 closed: Settle | None = None) -> None:
        # Handlers take the plain lock (a C call); the Condition (a Python
        # wrapper around the same lock) only where the sender waits or is woken.
        # ``lock``: the subscription's own, so that a finished handler frees its
        # slot and queues its credit (and its ack) in one critical section.
        self._lock = lock or threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._opening: pb.SubscribeRequest | None = opening
        self._credit_batch = credit_batch
        self._counters = counters
        self._closed_settle = closed  # settle() once this call is closed
        self._acks: list[int] = []
        self._nacks: dict[int, list[int]] = {}  # delay_ms -> offsets
        self._nacked = 0
        self._credits = 0
        self._since: float | None = None  # when the oldest unsent item was added
        self._woken = False  # the sender was told the outbox is due (until it drains)
        self._parked = False  # the sender waits with no timer (nothing queued, no linger)
        self.open = True
        self.call: StreamingCall | None = None

    def _due_locked(self) -> bool:
        return (self._opening is not None or self._credits >= self._credit_batch
                or len(self._acks) + self._nacked >= ACK_FLUSH_MAX)

    def _drain_locked(self) -> list[pb.SubscribeRequest]:
        """Take what is queued and make it requests (tests; the sender builds them unlocked)."""
        return self._requests(*self._take_locked())

    def _take_locked(self) -> tuple[pb.SubscribeRequest | None, list[int],
                                    dict[int, list[int]], int, int]:
        """Take what is queued: (opening, acks, nacks by delay, nack count, credits)."""
        # First the interval: an ack appended without the lock (settle) after the acks
        # are taken below then sees no interval running, and starts one.
        self._since = None
        self._woken = False
        # Acks are taken from the front of the list, which stays: a handler that read
        # the attribute before a swap would append to a list already sent.
        count = len(self._acks)
        acks = self._acks[:count]
        del self._acks[:count]
        taken = (self._opening, acks, self._nacks, self._nacked, self._credits)
        self._opening = None
        self._nacks, self._nacked, self._credits = {}, 0, 0
        return taken

    def _requests(self, opening: pb.SubscribeRequest | None, acks: list[int],
                  nacks_by_delay: dict[int, list[int]], nacked: int,
                  credits: int) -> list[pb.SubscribeRequest]:
        """What ``_take_locked`` took, as the requests to send (built outside the lock)."""
        out: list[pb.SubscribeRequest] = []
        granted = credits
        if opening is not None:
            granted += opening.credits
            out.append(opening)
        nacks = list(nacks_by_delay.items())
        if acks or credits or nacks:
            # As ranges: a window of handlers acks runs of consecutive offsets,
            # which the broker settles a span at a time instead of offset by offset.
            request = pb.SubscribeRequest(credits=credits, ack_ranges=[
                pb.OffsetRange(start=start, end=end) for start, end in _ack_ranges(acks)])
            if nacks:  # the first nack delay rides along, further ones need a request each
                delay_ms, offsets = nacks.pop(0)
                request.nack_offsets.extend(offsets)
                request.nack_delay_ms = delay_ms
            out.append(request)
        out.extend(pb.SubscribeRequest(nack_offsets=offsets, nack_delay_ms=delay_ms)
                   for delay_ms, offsets in nacks)
        if out:
            self._counters.add(requests=len(out), acks=len(acks), nacks=nacked,
                               credits=granted)
        return out

    def request_iterator(self) -> Iterator[pb.SubscribeRequest]:
        linger = False  # after a send: wait an interval for more before parking
        while True:
            with self._cond:
                while self.open and not self._due_locked():
                    if self._since is None:  # nothing queued
                        if linger:
                            linger = False
                            self._cond.wait(ACK_FLUSH_INTERVAL_S)
                        else:
                            self._parked = True
                            self._cond.wait()
                            self._parked = False
                        continue
                    left = self._since + ACK_FLUSH_INTERVAL_S - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                taken = self._take_locked()
                still_open = self.open
            batch = self._requests(*taken)
            if not batch and not still_open:
                return  # half-close once everything queued was sent
            linger = bool(batch)
            yield from batch

    def _wake_locked(self, due: bool) -> None:
        """Start the interval at the first item since a send; wake the sender if it must act.

        The sender must be woken when the outbox became due (once per send: a
        handler thread paying for a notify on every item after that was a
        third of what a fast subscription spent per message), and for the
        first item only when it is parked: after a send it lingers one
        interval and finds that item by itself. (Waking it for every first
        item cost a thread switch and a contended lock per batch.)
        """
        if self._since is None:
            self._since = time.monotonic()
            if not due and not self._parked:
                return
        if due:
            self._woken = True
        self._cond.notify()

    def ack(self, offset: int) -> bool:
        with self._lock:
            if not self.open:
                return False
            self._acks.append(offset)
            due = not self._woken and len(self._acks) + self._nacked >= ACK_FLUSH_MAX
            if self._since is None or due:
                self._wake_locked(due)
        return True

    def settle(self, lease: Lease, how: str, delay_ms: int) -> None:
        """The ``Settle`` of the leases this call delivered: queue the ack or nack here.

        An ack is appended without the lock (``list.append`` is atomic, and the
        sender takes acks from the front of the same list, never swapping it):
        a handler that acks its lease itself then takes the lock once per
        message (its credit), not twice. Once the call is closed, the
        ``closed`` settle given at construction takes it (the subscription's
        current call, or a unary call); an ack that raced the close goes both
        ways, and the broker counts a second ack of a message as nothing.
        """
        if how == "ack":
            if self.open:
                acks = self._acks
                acks.append(lease[LEASE_OFFSET])
                if self._since is None or (not self._woken
                                           and len(acks) + self._nacked >= ACK_FLUSH_MAX):
                    with self._lock:
                        due = not self._woken and len(acks) + self._nacked >= ACK_FLUSH_MAX
                        if self._since is None or due:
                            self._wake_locked(due)
                if self.open:  # still open after the append: the sender's last take has it
                    return
        elif self.nack(lease[LEASE_OFFSET], delay_ms):
            return
        if self._closed_settle is None:
            raise RuntimeError("settled on a closed outbox with nowhere else to go")
        self._closed_settle(lease, how, delay_ms)

    def finish_locked(self, ack: int | None, credit: bool) -> bool | None:
        """A handler finished (the caller holds the lock): queue its ack and its credit.

        ``ack``: the offset to ack, if the handler left its lease unsettled;
        ``credit``: free its slot (not while the subscription stops). One
        critical section for both, instead of one for the ack and one for the
        credit. Returns None when the call is closed (nothing queued: the
        caller acks another way), else whether the outbox just became due.
        """
        if not self.open:
            return None
        if ack is not None:
            self._acks.append(ack)
        if credit:
            self._credits += 1
        due = not self._woken and (self._credits >= self._credit_batch
                                   or len(self._acks) + self._nacked >= ACK_FLUSH_MAX)
        if self._since is None or due:
            self._wake_locked(due)
        return due

    def nack(self, offset: int, delay_ms: int) -> bool:
        with self._lock:
            if not self.open:
                return False
            self._nacks.setdefault(delay_ms, []).append(offset)
            self._nacked += 1
            due = not self._woken and len(self._acks) + self._nacked >= ACK_FLUSH_MAX
            if self._since is None or due:
                self._wake_locked(due)
        return True

    def close(self) -> None:
        """Send what is queued at once, then half-close."""
        with self._cond:
            self.open = False
            self._cond.notify()

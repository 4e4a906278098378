"""Ordering by key in a shared group: at most one unfinished message per key.

With ``ordering="key"`` a shared group hands out a message with a key only
when no earlier message with that key is unfinished (leased, waiting for a
redelivery, or being dead-lettered); the later ones are *held* (leases.py,
``HELD``) and released one at a time, in offset order, as the one before
finishes (acked or dead-lettered). A nacked or expired message therefore comes
back before anything later of its key. Keys are not pinned to members, so
members join and leave with no rebalancing; messages without a key are not
ordered. Kafka's share groups, JetStream and Redis offer no such mode;
Pulsar's Key_Shared pins keys to consumers instead.

``KeyOrder`` is the bookkeeping: which key is busy with which offset, and
the held offsets of each key in order. It decides, row by row, which fresh
messages are delivered and which are held (``plan``), and which held offset
is released when a busy one finishes. The per-row work is one dict lookup;
the rows stay Arrow slices.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from npstream.broker.groups.deliveries import Rows

__all__ = ["KeyOrder", "Run"]

# A run of consecutive fresh offsets with one decision: (deliver?, their rows).
Run = tuple[bool, list[Rows]]


def _keys(part: Rows) -> list[bytes | None]:
    if isinstance(part, list):
        return [row.key for row in part]
    return part.column("key").to_pylist()


def _slice(part: Rows, start: int, stop: int) -> Rows:
    if isinstance(part, list):
        return part[start:stop]
    return part.slice(start, stop - start)


class KeyOrder:
    """Busy keys and held offsets of one group (see the module doc). Not thread-safe."""

    def __init__(self) -> None:
        self._busy: dict[bytes, int] = {}  # key -> offset of its one unfinished message
        self._key_of: dict[int, bytes] = {}  # that offset -> its key
        self._held: dict[bytes, deque[int]] = {}  # key -> held offsets, oldest first

    @property
    def held(self) -> int:
        return sum(len(q) for q in self._held.values())

    def plan(self, first: int, parts: list[Rows]) -> list[Run]:
        """Split fresh rows from offset ``first`` into runs to deliver and runs to hold."""
        runs: list[Run] = []

        def add(deliver: bool, piece: Rows) -> None:
            if runs and runs[-1][0] == deliver:
                runs[-1][1].append(piece)
            else:
                runs.append((deliver, [piece]))

        offset = first
        for part in parts:
            keys = _keys(part)
            if self._all_free(keys, offset):
                add(True, part)
                offset += len(keys)
                continue
            start = 0
            decision: bool | None = None
            for i, key in enumerate(keys):
                deliver = key is None or self._take(key, offset + i)
                if decision is not None and deliver != decision:
                    add(decision, _slice(part, start, i))
                    start = i
                decision = deliver
            if decision is not None:
                add(decision, part if start == 0 else _slice(part, start, len(keys)))
            offset += len(keys)
        return runs

    def _all_free(self, keys: list[bytes | None], first: int) -> bool:
        """The common case with many keys, decided in bulk: no key of ``keys`` is busy and
        none repeats, so every row is delivered; their keys are marked busy."""
        offsets: Iterable[int] = range(first, first + len(keys))
        if None in keys:
            pairs = [(k, o) for k, o in zip(keys, offsets, strict=True) if k is not None]
            keys, offsets = [k for k, _o in pairs], [o for _k, o in pairs]
        distinct = set(keys)
        if len(distinct) != len(keys) or not self._busy.keys().isdisjoint(distinct):
            return False
        # zip and dict.update run in C: no Python step per row in the common case.
        self._busy.update(zip(keys, offsets, strict=True))  # type: ignore[arg-type]
        self._key_of.update(zip(offsets, keys, strict=True))  # type: ignore[arg-type]
        return True

    def _take(self, key: bytes, offset: int) -> bool:
        """True: ``offset`` may be delivered (its key becomes busy); False: it is held."""
        if key in self._busy:
            self._held.setdefault(key, deque()).append(offset)
            return False
        self._busy[key] = offset
        self._key_of[offset] = key
        return True

    def finished(self, ranges: Iterable[tuple[int, int]],
                 unfinished: list[tuple[int, int]]) -> list[int]:
        """After acks/dead letters in ``ranges``: the held offsets whose turn has come.

        ``unfinished``: runs within the ranges whose messages are not finished
        after all (an ack of a message being dead-lettered); usually none.
        """
        released: list[int] = []
        key_of = self._key_of
        for lo, hi in ranges:
            if hi - lo <= len(key_of):
                busy = list(filter(key_of.__contains__, range(lo, hi)))  # in C, not per row
            else:
                busy = [o for o in key_of if lo <= o < hi]
            done = busy if not unfinished else [
                o for o in busy if not any(a <= o < b for a, b in unfinished)]
            if not self._held:  # nothing waits: free the keys in bulk, in C
                if len(done) == len(key_of):  # every busy key (_busy is key_of inverted)
                    key_of.clear()
                    self._busy.clear()
                else:
                    deque(map(self._busy.pop, map(key_of.pop, done)), maxlen=0)
                continue
            for offset in done:
                released += self._next(offset, lo_bound=None)
        return released

    def _next(self, offset: int, lo_bound: int | None) -> list[int]:
        """Free the key of finished ``offset``; its next held offset (>= lo_bound) is busy now."""
        key = self._key_of.pop(offset)
        queue = self._held.get(key)
        while queue:
            following = queue.popleft()
            if lo_bound is not None and following < lo_bound:
                continue  # removed from the log as well
            self._busy[key] = following
            self._key_of[following] = key
            if not queue:
                del self._held[key]
            return [following]
        self._held.pop(key, None)
        del self._busy[key]
        return []

    def drop_below(self, start: int) -> list[int]:
        """Offsets below ``start`` left the log: forget them; returns held offsets released."""
        released: list[int] = []
        for offset in sorted(o for o in self._key_of if o < start):
            released += self._next(offset, lo_bound=start)
        for key, queue in list(self._held.items()):
            while queue and queue[0] < start:
                queue.popleft()
            if not queue:
                del self._held[key]
        return released

    def clear(self) -> None:
        self._busy.clear()
        self._key_of.clear()
        self._held.clear()


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

``KeyOrder`` is the bookkeeping: which keys are busy, which offset holds each
busy key, and the held offsets of each key in order. It decides which fresh
messages are delivered and which are held (``plan``), and which held offset
is released when a busy one finishes (``finished``).

Why blocks: ordering by key should cost little more than not ordering
(docs/benchmarks.md has the figures). A per-offset record of the busy key (a
dict entry made, looked up and popped per message) costs as much per message
as the rest of a batched delivery. So the busy offsets
of one planned part are kept as one ``_Block``: its first offset, its keys
(one list, made once by Arrow) and a mask of the rows whose key they hold.
The busy keys themselves are one set, filled and emptied with set operations
that run in C; a part whose keys are distinct and free (the common case with
many keys) is decided with one ``isdisjoint``. Parts with repeated or busy
keys are decided with Arrow kernels and numpy masks (``_split``); only held
rows, and keys that have held rows when they finish, take a Python step
each. A held offset released for delivery, and a part of a few rows, is busy
alone (``_single``). The held offsets stay per key (a deque each), so a
finish releases a key's next one in O(1) however many are held: a hot key
may hold a million.
"""

from __future__ import annotations

import operator
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Iterable
from itertools import compress, pairwise, repeat
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from npstream.broker.groups.deliveries import Rows
from npstream.broker.groups.leases import merged_runs
from npstream.broker.groups.tuning import KEY_ORDER_SINGLES_UP_TO, KEY_ORDER_SLICES_UP_TO

__all__ = ["KeyOrder", "Plan"]

_KEY_TYPE = pa.binary()  # MESSAGE_SCHEMA's key


class Plan(NamedTuple):
    """What ``plan`` decided for fresh rows: ``runs`` of consecutive offsets, each
    (deliver?, how many), in offset order; ``rows``: the rows delivered, in offset order."""

    runs: list[tuple[bool, int]]
    rows: list[Rows]


_END = 1 << 63  # sorts after every run end: bisect_right(runs, (offset, _END))


def _keys(part: Rows) -> list[bytes | None]:
    if isinstance(part, list):
        return [row.key for row in part]
    return part.column("key").to_pylist()


def _slice(part: Rows, start: int, stop: int) -> Rows:
    if isinstance(part, list):
        return part[start:stop]
    return part.slice(start, stop - start)


def _filter(part: Rows, mask: np.ndarray) -> Rows:
    if isinstance(part, list):
        return list(compress(part, mask.tolist()))
    return part.filter(pa.array(mask))


def _mask(values: Iterable[bool], count: int) -> np.ndarray:
    return np.fromiter(values, dtype=bool, count=count)


def _key_column(part: Rows, keys: list[bytes | None]) -> pa.Array:
    if isinstance(part, list):
        return pa.array(keys, _KEY_TYPE)
    return part.column("key")


def _first_occurrences(keys: pa.Array) -> np.ndarray:
    """Which rows hold the first occurrence of their key (rows without a key: False).

    ``dictionary_encode`` numbers the keys in order of first occurrence, so a
    row is a first exactly when its index is above every index before it.
    """
    indices = keys.dictionary_encode().indices
    if indices.null_count:
        indices = indices.fill_null(-1)
    index = indices.to_numpy()
    first = np.empty(len(index), dtype=bool)
    if len(index):
        first[0] = index[0] >= 0
        first[1:] = index[1:] > np.maximum.accumulate(index)[:-1]
    return first


class _Block:
    """Busy offsets of one planned part: ``lo + i`` holds ``keys[i]`` where ``busy[i]``."""

    __slots__ = ("busy", "keys", "left", "lo")

    def __init__(self, lo: int, keys: list[bytes | None], busy: np.ndarray,
                 left: int) -> None:
        self.lo = lo
        self.keys = keys
        self.busy = busy
        self.left = left  # rows still busy

    @property
    def hi(self) -> int:
        return self.lo + len(self.keys)


class KeyOrder:
    """Busy keys and held offsets of one group (see the module doc). Not thread-safe."""

    def __init__(self) -> None:
        self._busy: set[bytes] = set()  # keys with an unfinished message
        self._blocks: dict[int, _Block] = {}  # by first offset
        self._starts: list[int] = []  # sorted firsts of _blocks
        self._single: dict[int, bytes] = {}  # offset busy alone -> its key (tuning.py)
        self._held: dict[bytes, deque[int]] = {}  # key -> held offsets, oldest first

    @property
    def held(self) -> int:
        return sum(len(q) for q in self._held.values())

    @property
    def busy(self) -> int:
        """Keys with an unfinished message (for tests and inspection)."""
        return len(self._busy)

    # ------------------------------------------------------------ planning

    def plan(self, first: int, parts: list[Rows]) -> Plan:
        """Split fresh rows from offset ``first`` into runs to deliver and runs to hold.

        The rows delivered of a part with many holes come filtered out of it in
        one step (Arrow's filter), not as a slice per run: with keys that
        repeat, a batch of 1,000 is ~100 runs, and a part per run cost the
        delivery table more than the rows did. A part with a few holes is
        sliced (no copy of its rows).
        """
        runs: list[tuple[bool, int]] = []
        rows: list[Rows] = []

        def add(deliver: bool, count: int) -> None:
            if runs and runs[-1][0] == deliver:
                runs[-1] = (deliver, runs[-1][1] + count)
            else:
                runs.append((deliver, count))

        offset = first
        for part in parts:
            keys = _keys(part)
            count = len(keys)
            if not count:
                continue
            deliver = self._all_free(part, keys, offset)
            if deliver is None:
                add(True, count)
                rows.append(part)
            else:
                edges = np.flatnonzero(deliver[1:] != deliver[:-1]) + 1
                delivered = []
                for lo, hi in pairwise([0, *edges.tolist(), count]):
                    add(bool(deliver[lo]), hi - lo)
                    if deliver[lo]:
                        delivered.append((lo, hi))
                if len(delivered) > KEY_ORDER_SLICES_UP_TO:
                    rows.append(_filter(part, deliver))
                else:  # a few holes: slices share the stored rows, a filter would copy them
                    rows += [_slice(part, lo, hi) for lo, hi in delivered]
            offset += count
        return Plan(runs, rows)

    def _all_free(self, part: Rows, keys: list[bytes | None],
                  first: int) -> np.ndarray | None:
        """Mark the keys of fresh rows from ``first`` busy; None if every row is delivered,
        else the mask of rows delivered (the others are held).

        The common case with many keys, keys distinct and none busy, is decided
        with set operations in C; otherwise numpy masks decide (``_split``).
        """
        distinct: set[bytes] = set(keys)  # type: ignore[arg-type]  # None is dropped next
        count = len(keys)
        keyless = None in distinct
        if keyless:
            distinct.discard(None)
        nulls = keys.count(None) if keyless else 0
        if len(distinct) + nulls == count and self._busy.isdisjoint(distinct):
            if self._busy:
                self._busy |= distinct
            else:  # nothing busy (the last batch was acked): the part's set is the busy set
                self._busy = distinct
            if count <= KEY_ORDER_SINGLES_UP_TO:  # a lone message (a tailing member): no block
                self._single.update((first + i, key) for i, key in enumerate(keys)
                                    if key is not None)
                return None
            busy = (_mask(map(operator.is_not, keys, repeat(None)), count) if keyless
                    else np.ones(count, dtype=bool))
            self._add_block(_Block(first, keys, busy, len(distinct)))
            return None
        return self._split(_key_column(part, keys), keys, distinct, first, keyless)

    def _split(self, column: pa.Array, keys: list[bytes | None], distinct: set[bytes],
               first: int, keyless: bool) -> np.ndarray:
        """Rows whose key is busy or repeats an earlier row of the part are held.

        The first row of each key is read off Arrow's ``dictionary_encode`` (its
        indices appear in order of first occurrence), and only the busy keys the
        part meets (a set intersection in C) are looked for row by row, with
        one ``is_in``: a dict of first rows and two ``fromiter`` passes cost
        about twice as much for 1,000 keys.
        """
        deliver = _first_occurrences(column)
        met = self._busy & distinct
        if met:
            busy = pc.is_in(column, value_set=pa.array(list(met), _KEY_TYPE))
            deliver &= ~busy.to_numpy(zero_copy_only=False)
        keyed = deliver
        if keyless:
            deliver = deliver | column.is_null().to_numpy(zero_copy_only=False)
        held = self._held
        for row in np.flatnonzero(~deliver).tolist():  # a Python step per held row only
            key = keys[row]
            queue = held.get(key)  # type: ignore[arg-type]
            if queue is None:
                queue = held[key] = deque()  # type: ignore[index]
            queue.append(first + row)
        taken = list(compress(keys, keyed))
        self._busy.update(taken)  # type: ignore[arg-type]
        if taken:
            self._add_block(_Block(first, keys, keyed, len(taken)))
        return deliver

    def _add_block(self, block: _Block) -> None:
        self._blocks[block.lo] = block
        insort(self._starts, block.lo)

    def _drop_block(self, block: _Block) -> None:
        del self._blocks[block.lo]
        del self._starts[bisect_left(self._starts, block.lo)]

    # ------------------------------------------------------------ finishing

    def finished(self, ranges: Iterable[tuple[int, int]], unfinished: list[tuple[int, int]],
                 *, merged: bool = False) -> list[int]:
        """After acks/dead letters in ``ranges``: the held offsets whose turn has come.

        ``unfinished``: runs within the ranges whose messages are not finished
        after all (an ack of a message being dead-lettered); usually none.
        ``merged``: ``ranges`` are already sorted and merged (``merged_runs``).
        """
        runs = list(ranges) if merged else merged_runs(ranges)
        return self._finish(runs, unfinished, lo_bound=None)

    def _finish(self, runs: list[tuple[int, int]], unfinished: list[tuple[int, int]],
                lo_bound: int | None) -> list[int]:
        """Free the keys busy at offsets in ``runs`` (sorted, disjoint), but ``unfinished``.

        Acks with ordering="key" come as many short runs (held rows cut the
        batches), so the rows of each block are matched against all runs at
        once with numpy, not run by run.
        """
        if not runs:
            return []
        freed: list[bytes] = []
        los = np.array([lo for lo, _hi in runs], dtype=np.int64)
        his = np.array([hi for _lo, hi in runs], dtype=np.int64)
        done: list[_Block] = []
        for block in self._blocks_touched(runs):
            count = len(block.keys)
            j = bisect_right(runs, (block.lo, _END)) - 1
            if (j >= 0 and runs[j][1] >= block.hi and block.left == count
                    and not _overlaps(unfinished, block.lo, block.hi)):
                freed += block.keys  # type: ignore[arg-type]  # every row busy: no None
                done.append(block)
                continue
            offsets = np.arange(block.lo, block.hi, dtype=np.int64)
            rows = block.busy & _inside(los, his, offsets)
            if unfinished:
                rows &= ~_inside(*_bounds(unfinished), offsets)
            taken = list(compress(block.keys, rows))
            if not taken:
                continue
            freed += taken  # type: ignore[arg-type]
            block.busy &= ~rows
            block.left -= len(taken)
            if not block.left:
                done.append(block)
        for block in done:
            self._drop_block(block)
        single = self._single
        if single:
            offsets = np.fromiter(single, dtype=np.int64, count=len(single))
            rows = _inside(los, his, offsets)
            if unfinished:
                rows &= ~_inside(*_bounds(unfinished), offsets)
            freed += map(single.pop, offsets[rows].tolist())
        return self._free(freed, lo_bound)

    def _blocks_touched(self, runs: list[tuple[int, int]]) -> list[_Block]:
        """The blocks holding any offset of ``runs``, each once, found run by run (an ack
        of two far-apart offsets does not look at the blocks between them)."""
        starts, blocks = self._starts, self._blocks
        touched: dict[int, _Block] = {}
        for lo, hi in runs:
            i = max(0, bisect_right(starts, lo) - 1)
            while i < len(starts) and starts[i] < hi:
                block = blocks[starts[i]]
                i += 1
                if block.hi > lo:
                    touched[block.lo] = block
        return list(touched.values())

    def _free(self, keys: list[bytes], lo_bound: int | None) -> list[int]:
        """Free ``keys`` (their message finished); a key with held offsets takes its next."""
        if not keys:
            return []
        if len(keys) == len(self._busy):  # each busy key once, so all of them (a batch acked)
            self._busy = set()
        else:
            self._busy.difference_update(keys)
        if not self._held:
            return []
        released: list[int] = []
        for key in self._held.keys() & keys:  # a Python step only for keys that wait
            queue = self._held[key]
            while queue:
                following = queue.popleft()
                if lo_bound is not None and following < lo_bound:
                    continue  # removed from the log as well
                self._busy.add(key)
                self._single[following] = key
                released.append(following)
                break
            if not queue:
                del self._held[key]
        released.sort()
        return released

    def drop_below(self, start: int) -> list[int]:
        """Offsets below ``start`` left the log: forget them; returns held offsets released."""
        released = self._finish([(-1, start)], [], lo_bound=start)
        for key, queue in list(self._held.items()):
            while queue and queue[0] < start:
                queue.popleft()
            if not queue:
                del self._held[key]
        return released

    def clear(self) -> None:
        self._busy.clear()
        self._blocks.clear()
        self._starts.clear()
        self._single.clear()
        self._held.clear()




def _overlaps(runs: list[tuple[int, int]], lo: int, hi: int) -> bool:
    return any(a < hi and lo < b for a, b in runs)


def _bounds(runs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    merged = merged_runs(runs)
    return (np.array([lo for lo, _hi in merged], dtype=np.int64),
            np.array([hi for _lo, hi in merged], dtype=np.int64))


def _inside(los: np.ndarray, his: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Which ``offsets`` lie in one of the sorted, disjoint runs ``[los[i], his[i])``."""
    at = np.searchsorted(los, offsets, side="right") - 1
    return (at >= 0) & (offsets < his[np.maximum(at, 0)])

"""Producer-id deduplication: the ids stored within the last ``dedup_window_ms``.

A message whose id was stored less than ``dedup_window_ms`` ago (broker
timestamps) is not stored again; the append reports the original offset.
Within one append the first occurrence of an id wins.

The window is kept in memory as one dict id -> offset plus, per stored batch,
a *generation* (timestamp, ids -> offsets) so that expiry drops whole batches
at once. Set operations on dict views and ``map`` do the per-id work in C:
there is no Python loop over rows. After a restart the state is rebuilt from
the log (``rebuild_window`` reads the batches inside the window whose frames
carry the producer-ids flag), so it needs no file of its own; truncation and
deletion drop the ids of the removed offsets, keeping the state equal to what
a rebuild would produce.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.reader import (
    LogView,
    decode_frame,
    iter_frames,
    offset_for_timestamp,
)
from npstream.broker.storage.tuning import SCAN_CHUNK_BYTES

__all__ = ["DedupWindow", "IntraDuplicates", "find_intra_duplicates", "rebuild_window"]

_first = itemgetter(0)


@dataclass(frozen=True)
class IntraDuplicates:
    """Rows of one append repeating an id seen earlier in the same append."""

    rows: np.ndarray  # indexes of the repeating rows
    first_rows: np.ndarray  # for each, the index of the row with the first occurrence


def find_intra_duplicates(ids: pa.Array, supplied: pa.BooleanArray) -> IntraDuplicates | None:
    """Repeated producer ids within one append (first occurrence wins), or None."""
    rows_with_ids = np.flatnonzero(np.asarray(supplied))
    if len(rows_with_ids) < 2:
        return None
    given = ids.take(pa.array(rows_with_ids))
    if pc.count_distinct(given).as_py() == len(given):
        return None
    # unique() keeps first-appearance order, so a row is a first occurrence
    # exactly when its position among the uniques exceeds every earlier one.
    positions = np.asarray(pc.index_in(given, value_set=pc.unique(given)), dtype=np.int64)
    running_max = np.maximum.accumulate(np.concatenate(([-1], positions[:-1])))
    is_first = positions > running_max
    first_rows = rows_with_ids[is_first]
    repeated = ~is_first
    return IntraDuplicates(rows_with_ids[repeated], first_rows[positions[repeated]])


@dataclass(slots=True)
class _Generation:
    """The ids of one stored batch."""

    timestamp_ms: int
    first: int
    last: int
    ids: dict[str, int]


class DedupWindow:
    """Ids stored within the window, with their offsets. Not thread-safe: the writer owns it."""

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self._seen: dict[str, int] = {}
        self._generations: deque[_Generation] = deque()

    def __len__(self) -> int:
        return len(self._seen)

    def expire(self, now_ms: int) -> None:
        """Forget generations stored ``window_ms`` or more before ``now_ms``."""
        generations = self._generations
        while generations and generations[0].timestamp_ms + self.window_ms <= now_ms:
            self._drop(generations.popleft().ids)

    def lookup(self, ids: list[str]) -> dict[str, int]:
        """The ids of ``ids`` stored within the window, with their original offsets."""
        if not self._seen:
            return {}
        hits = self._seen.keys() & ids
        return {key: self._seen[key] for key in hits} if hits else {}

    def remember(self, timestamp_ms: int, ids: list[str], offsets: list[int]) -> None:
        """Record the ids of one stored batch (offsets ascending)."""
        if not ids:
            return
        generation = dict(zip(ids, offsets, strict=True))
        self._seen.update(generation)
        self._generations.append(_Generation(timestamp_ms, offsets[0], offsets[-1], generation))

    def forget_from(self, offset: int) -> None:
        """Forget ids stored at ``offset`` or later (the log was truncated there)."""
        generations = self._generations
        while generations and generations[-1].first >= offset:
            self._drop(generations.pop().ids)
        if generations and generations[-1].last >= offset:
            self._trim(generations[-1], lambda stored: stored >= offset)

    def forget_below(self, offset: int) -> None:
        """Forget ids stored below ``offset`` (the start offset moved there)."""
        generations = self._generations
        while generations and generations[0].last < offset:
            self._drop(generations.popleft().ids)
        if generations and generations[0].first < offset:
            self._trim(generations[0], lambda stored: stored < offset)

    def clear(self) -> None:
        self._seen.clear()
        self._generations.clear()

    def _drop(self, generation: dict[str, int]) -> None:
        """Remove a generation's ids, unless a later batch re-stored them (framed appends)."""
        owned = self._seen.items() & generation.items()
        deque(map(self._seen.pop, map(_first, owned), repeat(None)), maxlen=0)

    def _trim(self, generation: _Generation, remove: Callable[[int], bool]) -> None:
        """Drop the ids of the one generation a truncation or deletion point cuts through.

        Runs only for that boundary batch, on an administrative operation.
        """
        kept = {key: stored for key, stored in generation.ids.items() if not remove(stored)}
        self._drop({key: stored for key, stored in generation.ids.items() if remove(stored)})
        generation.ids = kept
        if kept:
            generation.first = min(kept.values())
            generation.last = max(kept.values())


def rebuild_window(view: LogView, cache: FileCache, window_ms: int, now_ms: int) -> DedupWindow:
    """The window as it was before a restart, read back from the log.

    Only frames stored inside the window and flagged as carrying producer ids
    are decoded (their id column); the time index finds the first of them.
    """
    window = DedupWindow(window_ms)
    cutoff = now_ms - window_ms  # batches stored at or before this have expired
    first = offset_for_timestamp(view, cache, cutoff + 1)
    for segment, position, header, payload in iter_frames(
        view, cache, first, read_size=SCAN_CHUNK_BYTES
    ):
        if not header.has_producer_ids or header.max_timestamp <= cutoff:
            continue
        skip = max(0, view.start - header.base_offset)
        batch = decode_frame(view, segment, position, header, payload)
        ids = batch.column("id").slice(skip).to_pylist()
        window.remember(header.max_timestamp, ids,
                        list(range(header.base_offset + skip, header.next_offset)))
    return window

"""The time index of a segment: timestamp -> relative offset of a frame.

Sparse like the offset index (an entry is added for the same frames), each
entry 12 bytes, little-endian::

    +-----------------------------+---------------------------+
    | timestamp i64 (epoch ms)    | relative_offset u32       |
    | (min timestamp of the frame)| (frame base - segment     |
    |                             |  base offset)             |
    +-----------------------------+---------------------------+

Broker timestamps never decrease within a stream, so keys are sorted and
every message before an entry's frame is no later than the entry's
timestamp. To find the first message with timestamp >= t, take the last entry
whose timestamp is < t and walk forward from its frame: the answer lies at
most one index interval further. Persistence, validation and rebuild rules:
npstream.broker.storage.sparse_index.
"""

from __future__ import annotations

import numpy as np

from npstream.broker.storage.sparse_index import SparseIndex

__all__ = ["TimeIndex"]


class TimeIndex(SparseIndex):
    MAGIC = b"NPTI"
    KEY_TYPE = "q"
    VALUE_TYPE = "I"
    _ENTRY = np.dtype([("key", "<i8"), ("value", "<u4")])

    def relative_offset_before(self, timestamp_ms: int) -> int:
        """Relative offset of the last indexed frame whose min timestamp is < ``timestamp_ms``."""
        entry = self.last_below(timestamp_ms)
        return self.values[entry] if entry >= 0 else 0

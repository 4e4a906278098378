"""The offset index of a segment: relative offset -> byte position of a frame.

Sparse: one entry per ``index_interval_bytes`` of segment data (and always one
for the first frame), each entry 8 bytes, little-endian::

    +---------------------------+---------------------------+
    | relative_offset u32       | position u32              |
    | (frame base - segment     | (byte position of the     |
    |  base offset)             |  frame in the .log file)  |
    +---------------------------+---------------------------+

To read at offset ``o``, find the last entry with relative offset <=
``o - base`` and walk frames from its position: at most one interval of
frames lies between it and the frame holding ``o``. Persistence, validation
and rebuild rules: npstream.broker.storage.sparse_index.
"""

from __future__ import annotations

import numpy as np

from npstream.broker.storage.sparse_index import SparseIndex

__all__ = ["OffsetIndex"]


class OffsetIndex(SparseIndex):
    MAGIC = b"NPOI"
    KEY_TYPE = "I"
    VALUE_TYPE = "I"
    _ENTRY = np.dtype([("key", "<u4"), ("value", "<u4")])

    def position_at_or_before(self, relative_offset: int) -> int:
        """Byte position of the last indexed frame starting at or before ``relative_offset``."""
        entry = self.last_at_or_below(relative_offset)
        return self.values[entry] if entry >= 0 else 0

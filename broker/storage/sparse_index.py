"""Shared machinery of the two sparse per-segment indexes: entries in memory, the index file.

An index holds fixed-size entries (key, value) with non-decreasing keys, one
entry per ``index_interval_bytes`` of segment data, so a lookup is a binary
search followed by a walk over at most one interval of frames.

The active (tail) segment's indexes live only in memory and are rebuilt by
the recovery scan on open. When a segment is rolled (closed) its indexes are
written next to it, and trusted on later opens only while they describe the
segment file exactly: the file starts with a *seal* recording the segment's
size and mtime (and its next offset and max timestamp, so a closed segment
needs no scan at all), and a CRC32C over everything. An index file that is
missing, torn, or whose seal does not match the segment (the segment was
written to since) is rebuilt by scanning the segment, which also re-verifies
every frame's CRC. Index files are written without fsync: a crash can only
make them invalid, never wrong. Layout, little-endian::

     0      4    5      6        8               16               24
     +------+----+------+--------+---------------+----------------+
     |magic |ver |entry | reserv.| segment_size  | segment_mtime  |
     |4 B   | u8 |size u8| u16   |     u64       |   ns u64       |
     +------+----+------+--------+---------------+----------------+
    24              32              40            44         48
     +---------------+---------------+-------------+----------+----------
     |  next_offset  | max_timestamp | entry_count |  crc32c  | entries..
     |     i64       |    i64 (ms)   |    u32      |   u32    |
     +---------------+---------------+-------------+----------+----------

The CRC covers bytes 0..44 and the entries.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Self

import crc32c
import numpy as np

from npstream.broker.storage.errors import IndexFileError
from npstream.broker.storage.files import write_file_atomically

__all__ = ["IndexFileError", "SegmentSeal", "SparseIndex"]

_FILE_HEADER = struct.Struct("<4sBBHQQqqI")
_CRC = struct.Struct("<I")
FILE_HEADER_SIZE = _FILE_HEADER.size + _CRC.size
_VERSION = 1
assert FILE_HEADER_SIZE == 48


@dataclass(frozen=True, slots=True)
class SegmentSeal:
    """What a closed segment looked like when its index was written."""

    segment_size: int
    segment_mtime_ns: int
    next_offset: int
    max_timestamp: int


class SparseIndex:
    """Sorted (key, value) entries; subclasses fix the entry types and the file magic."""

    MAGIC: ClassVar[bytes]
    KEY_TYPE: ClassVar[str]  # array typecode and numpy dtype of keys
    VALUE_TYPE: ClassVar[str]
    _ENTRY: ClassVar[np.dtype]

    def __init__(self) -> None:
        self.keys: array = array(self.KEY_TYPE)
        self.values: array = array(self.VALUE_TYPE)

    def __len__(self) -> int:
        return len(self.keys)

    def append(self, key: int, value: int) -> None:
        """Add an entry; keys must not decrease and values must increase."""
        if self.keys and (key < self.keys[-1] or value <= self.values[-1]):
            raise ValueError(
                f"{type(self).__name__} entry ({key}, {value}) does not follow "
                f"the last entry ({self.keys[-1]}, {self.values[-1]})"
            )
        self.keys.append(key)
        self.values.append(value)

    def last_at_or_below(self, key: int) -> int:
        """Index of the last entry whose key <= ``key``, or -1."""
        return bisect_right(self.keys, key) - 1

    def last_below(self, key: int) -> int:
        """Index of the last entry whose key < ``key``, or -1."""
        return bisect_left(self.keys, key) - 1

    # ------------------------------------------------------------------ file form

    def to_bytes(self, seal: SegmentSeal) -> bytes:
        entries = np.empty(len(self.keys), dtype=self._ENTRY)
        entries["key"] = np.frombuffer(self.keys, dtype=self.KEY_TYPE) if self.keys else []
        entries["value"] = np.frombuffer(self.values, dtype=self.VALUE_TYPE) if self.values else []
        head = _FILE_HEADER.pack(
            self.MAGIC, _VERSION, self._ENTRY.itemsize, 0, seal.segment_size,
            seal.segment_mtime_ns, seal.next_offset, seal.max_timestamp, len(self.keys),
        )
        body = entries.tobytes()
        crc = crc32c.crc32c(body, crc32c.crc32c(head))
        return head + _CRC.pack(crc) + body

    @classmethod
    def from_bytes(cls, data: bytes) -> tuple[Self, SegmentSeal]:
        """Parse an index file; raise IndexFileError saying why it cannot be used."""
        if len(data) < FILE_HEADER_SIZE:
            raise IndexFileError(f"{len(data)} bytes, shorter than the header")
        (magic, version, entry_size, _reserved, size, mtime_ns, next_offset, max_ts,
         count) = _FILE_HEADER.unpack_from(data)
        if magic != cls.MAGIC or version != _VERSION or entry_size != cls._ENTRY.itemsize:
            raise IndexFileError(f"bad magic/version/entry size {magic!r}/{version}/{entry_size}")
        if len(data) != FILE_HEADER_SIZE + count * entry_size:
            raise IndexFileError(f"{len(data)} bytes do not hold {count} entries")
        (crc,) = _CRC.unpack_from(data, _FILE_HEADER.size)
        view = memoryview(data)
        actual = crc32c.crc32c(view[FILE_HEADER_SIZE:], crc32c.crc32c(view[: _FILE_HEADER.size]))
        if crc != actual:
            raise IndexFileError(f"CRC mismatch: stored {crc:#010x}, computed {actual:#010x}")
        entries = np.frombuffer(data, dtype=cls._ENTRY, offset=FILE_HEADER_SIZE, count=count)
        index = cls()
        index.keys.frombytes(np.ascontiguousarray(entries["key"]).astype(cls.KEY_TYPE).tobytes())
        index.values.frombytes(
            np.ascontiguousarray(entries["value"]).astype(cls.VALUE_TYPE).tobytes()
        )
        return index, SegmentSeal(size, mtime_ns, next_offset, max_ts)

    def write(self, path: Path, seal: SegmentSeal) -> None:
        write_file_atomically(path, self.to_bytes(seal), durable=False)

    @classmethod
    def read(cls, path: Path) -> tuple[Self, SegmentSeal]:
        """Load an index file; IndexFileError if it is missing or invalid."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise IndexFileError("missing") from None
        return cls.from_bytes(data)

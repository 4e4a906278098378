"""The record-batch frame: the unit written to and read from a segment file.

A segment file is a sequence of frames and nothing else. One frame holds one
stored batch: a fixed 48-byte header followed by the payload, an Arrow IPC
*encapsulated record-batch message* in MESSAGE_SCHEMA (npstream.proto.schema),
or for a typed stream in the stored schema of the header's ``schema_version``
(npstream.proto.value_schema.stored_schema); the schema itself is never stored
per batch. All integers are little-endian::

     0       4    5    6         8              12             16
     +-------+----+----+---------+--------------+--------------+
     | magic |ver |flag| reserved| payload_len  |   crc32c     |
     | NPSB  | u8 | u8 |  u16=0  |     u32      |     u32      |
     +-------+----+----+---------+--------------+--------------+
    16                          24             28             32
     +--------------------------+--------------+--------------+
     |       base_offset i64    |  count u32   | schema_ver   |
     |                          |              |     u32      |
     +--------------------------+--------------+--------------+
    32                          40                            48
     +--------------------------+-----------------------------+
     |  min_timestamp i64 (ms)  |   max_timestamp i64 (ms)    |
     +--------------------------+-----------------------------+
    48
     +----------------------------------------------------------
     | payload: payload_len bytes of Arrow IPC (multiple of 8)
     +----------------------------------------------------------

- ``magic`` is the 4 ASCII bytes ``NPSB``; ``ver`` is FORMAT_VERSION.
- ``flag`` bit 0 (FLAG_PRODUCER_IDS): at least one message of the batch carries
  a producer-supplied id, so the dedup state rebuild must read its ids;
  batches without it are skipped by that rebuild.
- ``crc32c`` (Castagnoli) covers header bytes 16..48 followed by the payload:
  everything after the CRC field. magic, version, flags and the length are
  checked structurally (a wrong length shows up as a CRC failure or as a
  frame running past the end of the file).
- ``schema_ver`` (``schema_version``): 0 for an untyped stream's batch (the
  payload is in MESSAGE_SCHEMA, binary ``value``); a typed stream's batch
  carries the version (1, 2, ...) of the value schema its ``value`` struct was
  written in, whose stored schema decodes the payload. Untyped frames are
  byte-identical to those written before typed streams existed (the field was
  a zero reserved word).
- ``base_offset`` is the offset of the first message, ``count`` the number of
  messages; the payload's ``offset`` column holds base_offset .. base_offset +
  count - 1, so a fetch sends the stored payload bytes as they are.
- Frames start at multiples of 8 (the header is 48 bytes and Arrow pads
  messages to 8), so payload buffers stay aligned for zero-copy reads.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass

import crc32c
import pyarrow as pa

from npstream.proto.frames import crc_patch

__all__ = [
    "FLAG_PRODUCER_IDS",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAGIC",
    "FrameError",
    "FrameHeader",
    "encode_frame",
    "encode_header_for_crc",
    "frame_crc",
    "parse_header",
]

MAGIC = b"NPSB"
FORMAT_VERSION = 1
FLAG_PRODUCER_IDS = 0x01
_KNOWN_FLAGS = FLAG_PRODUCER_IDS

# magic, version, flags, reserved, payload_len, crc | base_offset, count, schema_version,
# min_ts, max_ts
_HEADER = struct.Struct("<4sBBHII" "qIIqq")
HEADER_SIZE = _HEADER.size
_CRC_FIELD_END = 16  # the CRC covers everything from here on
assert HEADER_SIZE == 48


class FrameError(ValueError):
    """A frame header that cannot be right; ``detail`` says which check failed."""


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """The decoded header of one frame."""

    flags: int
    payload_length: int
    crc: int
    base_offset: int
    count: int
    min_timestamp: int
    max_timestamp: int
    schema_version: int = 0  # 0: untyped (MESSAGE_SCHEMA); else the value schema's version

    @property
    def frame_size(self) -> int:
        return HEADER_SIZE + self.payload_length

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count

    @property
    def has_producer_ids(self) -> bool:
        return bool(self.flags & FLAG_PRODUCER_IDS)


def frame_crc(buffer: bytes | bytearray | memoryview, start: int, header: FrameHeader) -> int:
    """CRC32C of the frame at ``start`` in ``buffer`` (header after the CRC field + payload)."""
    view = memoryview(buffer)
    return crc32c.crc32c(view[start + _CRC_FIELD_END : start + header.frame_size])


def parse_header(buffer: bytes | bytearray | memoryview, start: int = 0) -> FrameHeader:
    """Decode and structurally check the header at ``start``; raise FrameError if it is wrong.

    The CRC is not checked here (it needs the payload): call frame_crc.
    """
    (magic, version, flags, reserved, length, crc, base, count, schema_version, min_ts,
     max_ts) = _HEADER.unpack_from(buffer, start)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise FrameError(f"unsupported frame version {version}, expected {FORMAT_VERSION}")
    if flags & ~_KNOWN_FLAGS or reserved:
        raise FrameError(f"unknown flags {flags:#x} or non-zero reserved field")
    if length == 0 or length % 8:
        raise FrameError(f"bad payload length {length} (must be a positive multiple of 8)")
    if count == 0 or base < 0:
        raise FrameError(f"bad offsets: base_offset={base}, count={count}")
    if min_ts > max_ts:
        raise FrameError(f"bad timestamps: min {min_ts} > max {max_ts}")
    return FrameHeader(flags, length, crc, base, count, min_ts, max_ts, schema_version)


def encode_frame(
    payload: pa.Buffer | bytes,
    *,
    base_offset: int,
    count: int,
    min_timestamp: int,
    max_timestamp: int,
    flags: int = 0,
    schema_version: int = 0,
) -> tuple[bytes, FrameHeader]:
    """Header bytes for ``payload`` (an encapsulated Arrow IPC message), and the header.

    ``schema_version`` is 0 for an untyped batch, else the value schema
    version the payload was written in. The payload is not copied: callers
    write the header and the payload with one vectored write.
    """
    length = len(payload) if isinstance(payload, bytes) else payload.size
    tail = _tail(length, base_offset, count, min_timestamp, max_timestamp, schema_version)
    crc = crc32c.crc32c(payload, crc32c.crc32c(tail))
    return _packed(FrameHeader(flags, length, crc, base_offset, count, min_timestamp,
                               max_timestamp, schema_version), tail)


def encode_header_for_crc(fields: FrameHeader) -> tuple[bytes, FrameHeader]:
    """encode_frame for a payload known only by its length and CRC32C (crc_patch.py).

    ``fields`` is the header to write, except that its ``crc`` is the
    payload's CRC32C; the returned header has the frame's. A staged file is
    stamped into a segment this way, without reading its payloads back.
    """
    tail = _tail(fields.payload_length, fields.base_offset, fields.count,
                 fields.min_timestamp, fields.max_timestamp, fields.schema_version)
    crc = crc_patch.combine(crc32c.crc32c(tail), fields.crc, fields.payload_length)
    return _packed(dataclasses.replace(fields, crc=crc), tail)


def _tail(length: int, base_offset: int, count: int, min_timestamp: int,
          max_timestamp: int, schema_version: int) -> bytes:
    """Header bytes 16..48, the part the CRC covers."""
    if length == 0 or length % 8:
        raise ValueError(f"payload length {length} is not a positive multiple of 8")
    if not 0 <= schema_version < 1 << 32:
        raise ValueError(f"schema_version {schema_version} is not a u32")
    return struct.pack("<qIIqq", base_offset, count, schema_version, min_timestamp,
                       max_timestamp)


def _packed(header: FrameHeader, tail: bytes) -> tuple[bytes, FrameHeader]:
    return struct.pack("<4sBBHII", MAGIC, FORMAT_VERSION, header.flags, 0,
                       header.payload_length, header.crc) + tail, header

"""A staged file that becomes a segment in place: stamped, fsynced and renamed, never copied.

The exactly-once sink's commit used to copy every staged frame into the
stream's active segment. On a machine where fresh page cache is slow (the
2-core benchmark VM fills it at ~400 MB/s), that copy was most of a large
micro-batch's commit, and all Spark tasks waited for it. A staged file in the
*segment layout* (frames with placeholder headers: right payload length,
count and flags, base offset 0, timestamps 0, CRC 0, so it can never pass for
a segment by accident) needs no copy: the commit writes each frame's offsets
and timestamps (16 bytes a row) and its header with the real CRC into the
file itself, fsyncs it and renames it into the stream directory under its
base offset (SegmentList.adopt). Only those columns and the headers are
written; the payload bytes stay where Stage put them, and are not even read:
Stage recorded where the two columns are, what the placeholder offsets were
and the placeholder payload's CRC (StampSlot), from which the stamped
payload's CRC follows (crc_patch.py). That matters because Stage writes
around the page cache (direct_write.py): reading a payload back would come
from the disk.

Stamping is idempotent for a given base offset and timestamp (whole columns
are written, computed from the index, not from the file), so a commit
interrupted between stamping and the rename stamps the file again at the
restart and gets the same bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from npstream.broker.errors import MessageTooLargeError
from npstream.broker.storage.batch_builder import message_sizes
from npstream.broker.storage.direct_write import DirectFileWriter
from npstream.broker.storage.prebuilt import PrebuiltFrame, stamp_payload
from npstream.proto.frames import crc_patch
from npstream.proto.frames.payload import decode_payload
from npstream.proto.frames.record_batch import (
    FLAG_PRODUCER_IDS,
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    FrameHeader,
    encode_header_for_crc,
)

__all__ = ["FrameSlot", "StagedSegment", "Stamp", "StampSlot", "check_sizes", "placeholder_header",
           "stamp_all"]

_PAGE_CACHE = DirectFileWriter(direct=False)
# Files stamped at once by stamp_all (each waits on the disk most of the time).
STAMP_THREADS = 4
_ID_COLUMNS = [0, 1]  # offset, id: what the dedup window remembers of flagged frames


def placeholder_header(payload_length: int, count: int, flags: int) -> bytes:
    """The header a staged frame carries until its commit stamps it (see module doc)."""
    return (MAGIC + bytes([FORMAT_VERSION, flags, 0, 0])
            + payload_length.to_bytes(4, "little") + bytes(4)  # crc 0
            + bytes(8) + count.to_bytes(4, "little") + bytes(20))


@dataclass(frozen=True)
class StampSlot:
    """What stamping a frame needs besides its place: recorded when it was staged.

    The payload's offsets are ``placeholder_base``.. and its timestamps 0 until
    stamped; the two columns sit at these positions in the payload, and
    ``payload_crc`` is the CRC32C of the placeholder payload.
    """

    placeholder_base: int
    offsets_position: int
    timestamps_position: int
    payload_crc: int


@dataclass(frozen=True)
class FrameSlot:
    """One frame of a staged file: its payload's place, row count, flags, largest message."""

    payload_position: int  # the header is the HEADER_SIZE bytes before it
    payload_length: int
    count: int
    flags: int = 0
    max_message_bytes: int = 0
    stamp: StampSlot | None = None  # None in staging files of older brokers: copied only

    @property
    def header_position(self) -> int:
        return self.payload_position - HEADER_SIZE

    def stamped_ranges(self) -> list[tuple[int, int]]:
        """(file position, length) of what stamping writes: header, offsets, timestamps."""
        if self.stamp is None:
            return []
        return [(self.header_position, HEADER_SIZE),
                (self.payload_position + self.stamp.offsets_position, 8 * self.count),
                (self.payload_position + self.stamp.timestamps_position, 8 * self.count)]


@dataclass(frozen=True)
class StagedSegment:
    """A staged file in segment layout, holding ``slots`` back to back from byte 0.

    ``on_event(name)`` (tests' crash points) is called with "stamped" once the
    file is stamped and fsynced, "renaming" right before it is renamed into the
    stream and "adopted" once it is.
    """

    path: Path
    slots: tuple[FrameSlot, ...]
    on_event: Callable[[str], None] | None = field(default=None, compare=False)
    # How Stage wrote the file, so stamping keeps it out of the page cache (or not).
    writer: DirectFileWriter | None = field(default=None, compare=False)
    # Blocks of the file as Stage wrote them (DirectFileWriter.create_keeping), so
    # stamping need not read them back from the disk; checked current by the caller.
    known_blocks: Mapping[int, bytes] = field(default_factory=dict, compare=False)

    @property
    def count(self) -> int:
        return sum(slot.count for slot in self.slots)

    @property
    def size(self) -> int:
        last = self.slots[-1]
        return last.payload_position + last.payload_length

    def read_payload(self, slot: FrameSlot) -> bytes:
        """One frame's payload (for a size check or ids that need the rows)."""
        with open(self.path, "rb") as handle:
            handle.seek(slot.payload_position)
            return handle.read(slot.payload_length)

    def stamp(
        self, first: int, timestamp: int, fault_hook: Callable[[str, Path, int], None] | None,
    ) -> Stamp:
        """Stamp offsets first.. and ``timestamp`` into the file, fsync it.

        Only the offset and timestamp columns and the headers are written; the
        payloads are not read (their CRCs are patched: crc_patch.py), except
        for frames flagged as carrying producer ids, whose (offset, id)
        columns are returned for the dedup window. ValueError when the file
        does not have the size its index says (nothing is renamed then; the
        file may be half stamped, which a later stamp redoes: stamping writes
        whole columns computed from the index, never from the file).
        """
        headers: list[tuple[int, FrameHeader]] = []
        flagged: list[pa.RecordBatch] = []
        patches: list[tuple[int, object]] = []
        size = os.stat(self.path).st_size
        if size != self.size:
            raise ValueError(f"staged file {self.path} has {size} bytes, its index says "
                             f"{self.size}")
        base = first
        for slot in self.slots:
            stamp = slot.stamp
            if stamp is None:
                raise ValueError(f"staged frame at byte {slot.payload_position} of "
                                 f"{self.path} has no stamping data (an older format)")
            offsets = np.arange(base, base + slot.count, dtype="<i8")
            timestamps = np.full(slot.count, timestamp, dtype="<i8")
            crc = crc_patch.patch(
                stamp.payload_crc, slot.payload_length, stamp.offsets_position,
                np.arange(stamp.placeholder_base, stamp.placeholder_base + slot.count,
                          dtype="<i8"), offsets)
            crc = crc_patch.patch(crc, slot.payload_length, stamp.timestamps_position,
                                  np.zeros(slot.count, dtype="<i8"), timestamps)
            header_bytes, header = encode_header_for_crc(FrameHeader(
                slot.flags, slot.payload_length, crc, base, slot.count, timestamp, timestamp))
            if slot.flags & FLAG_PRODUCER_IDS:
                flagged.append(self._ids(slot, base, timestamp))
            if fault_hook is not None:
                fault_hook("write", self.path, slot.header_position)
            (header_at, _), (offsets_at, _), (timestamps_at, _) = slot.stamped_ranges()
            patches += [(header_at, header_bytes), (offsets_at, offsets),
                        (timestamps_at, timestamps)]
            headers.append((slot.header_position, header))
            base += slot.count
        # Only the headers and the two stamped columns are written: the rest of the file
        # stays as Stage wrote it (and, written directly, out of the page cache).
        before_sync = (None if fault_hook is None
                       else lambda: fault_hook("fsync", self.path, self.size))
        (self.writer or _PAGE_CACHE).patch(self.path, patches, before_sync, self.known_blocks)
        if self.on_event is not None:
            self.on_event("stamped")
        return headers, flagged

    def _ids(self, slot: FrameSlot, base: int, timestamp: int) -> pa.RecordBatch:
        """The (offset, id) columns of a flagged frame, as stamped (read back for them)."""
        batch = stamp_payload(memoryview(bytearray(self.read_payload(slot))), base, timestamp)
        if batch.num_rows != slot.count:
            raise ValueError(f"staged frame at byte {slot.payload_position} of {self.path} "
                             f"holds {batch.num_rows} rows, not {slot.count}")
        return batch.select(_ID_COLUMNS)


Stamp = tuple[list[tuple[int, FrameHeader]], list[pa.RecordBatch]]  # StagedSegment.stamp's result


def stamp_all(jobs: Sequence[tuple[StagedSegment, int]], timestamp: int,
              fault_hook: Callable[[str, Path, int], None] | None) -> list[Stamp]:
    """Stamp each (file, first offset) of one append, concurrently; results in order.

    A stamp mostly waits on the disk (a few block reads and writes, an
    fdatasync), so a micro-batch's dozens of files are stamped by a few
    threads at once. The first failure is raised once all are done.
    """
    if len(jobs) <= 1:
        return [staged.stamp(first, timestamp, fault_hook) for staged, first in jobs]
    with ThreadPoolExecutor(min(STAMP_THREADS, len(jobs)),
                            thread_name_prefix="stamp") as pool:
        futures = [pool.submit(staged.stamp, first, timestamp, fault_hook)
                   for staged, first in jobs]
    return [future.result() for future in futures]


def check_sizes(parts: Sequence[PrebuiltFrame | StagedSegment], stream: str, limit: int) -> None:
    """MessageTooLargeError for the first message over ``limit`` (0 = none), as append does.

    Frames carry their largest message size, so only a frame over the limit
    (the stream's limit was lowered after they were staged) is decoded.
    """
    if limit <= 0:
        return
    index = 0
    for part in parts:
        pieces = ([(part.count, part.max_message_bytes, lambda part=part: part.payload)]
                  if isinstance(part, PrebuiltFrame) else
                  [(slot.count, slot.max_message_bytes,
                    lambda part=part, slot=slot: part.read_payload(slot)) for slot in part.slots])
        for count, largest, payload in pieces:
            if largest > limit:
                sizes = message_sizes(pa.Table.from_batches([decode_payload(payload())]))
                row = int(np.argmax(sizes > limit))
                raise MessageTooLargeError(stream, index + row, int(sizes[row]), limit)
            index += count

"""A staged file that becomes a segment in place: stamped, fsynced and renamed, never copied.

Copying every staged frame into the stream's active segment would be most of
a large micro-batch's commit on a machine where fresh page cache is slow
(docs/benchmarks.md), and all Spark tasks wait for the commit. A staged file in the
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

The layout is storage's, so it is built here too (``build_staged_frames``):
the sink decides which rows go into which file and records the slots in its
own index, storage decides what a frame with a placeholder header is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from npstream.broker import faults
from npstream.broker.errors import MessageTooLargeError
from npstream.broker.storage.batch_builder import (
    build_message_batch,
    complete_publish_table,
    frame_slices,
    message_sizes,
    producer_id_mask,
    typed_publish_schema,
)
from npstream.broker.storage.direct_write import DirectFileWriter
from npstream.broker.storage.prebuilt import PrebuiltFrame, stamp_payload, stamp_ranges
from npstream.broker.storage.tuning import STAMP_THREADS
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
from npstream.proto.message_size import first_oversized
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.proto.value_schema import value_sizes

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer  # bytes, memoryview, mmap, pyarrow.Buffer...

__all__ = ["FrameSlot", "StagedSegment", "Stamp", "StampSlot", "StoredSchemas", "TypedFrames",
           "build_staged_frames", "check_sizes", "placeholder_header", "stamp_all"]

# How stamping patches a file: around the page cache when it was written so.
_PAGE_CACHE = DirectFileWriter(direct=False)
_DIRECT = DirectFileWriter(direct=True)
_ID_COLUMNS = [0, 1]  # offset, id: what the dedup window remembers of flagged frames
# The stored batch schema of a frame's value schema version (ValueSchemas.stored_schema).
StoredSchemas = Callable[[int], pa.Schema]


def _message_schema(version: int) -> pa.Schema:
    """An untyped stream's only frame schema."""
    if version:
        raise ValueError(f"frame in value schema version {version}, but no schemas were given")
    return MESSAGE_SCHEMA


def placeholder_header(payload_length: int, count: int, flags: int,
                       schema_version: int = 0) -> bytes:
    """The header a staged frame carries until its commit stamps it (see module doc)."""
    return (MAGIC + bytes([FORMAT_VERSION, flags, 0, 0])
            + payload_length.to_bytes(4, "little") + bytes(4)  # crc 0
            + bytes(8) + count.to_bytes(4, "little")
            + schema_version.to_bytes(4, "little") + bytes(16))


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
    """One frame of a staged file: its payload's place, row count, flags, largest message.

    ``schema_version``: the value schema version of a typed stream's frame
    (its payload is that version's stored schema), 0 for an untyped one.
    """

    payload_position: int  # the header is the HEADER_SIZE bytes before it
    payload_length: int
    count: int
    flags: int
    max_message_bytes: int
    stamp: StampSlot
    schema_version: int = 0

    @property
    def header_position(self) -> int:
        return self.payload_position - HEADER_SIZE

    def stamped_ranges(self) -> list[tuple[int, int]]:
        """(file position, length) of what stamping writes: header, offsets, timestamps."""
        return [(self.header_position, HEADER_SIZE),
                (self.payload_position + self.stamp.offsets_position, 8 * self.count),
                (self.payload_position + self.stamp.timestamps_position, 8 * self.count)]


@dataclass(frozen=True)
class StagedSegment:
    """A staged file in segment layout, holding ``slots`` back to back from byte 0.

    ``direct``: the file was written around the page cache (direct_write.py),
    so stamping patches it the same way and it stays out of the cache.
    ``known_blocks``: blocks of the file as they were written
    (DirectFileWriter.create_keeping), so stamping need not read them back
    from the disk; the caller checked that the file is unchanged since.
    """

    path: Path
    slots: tuple[FrameSlot, ...]
    direct: bool = False
    known_blocks: Mapping[int, bytes] = field(default_factory=dict, compare=False)

    @property
    def count(self) -> int:
        return sum(slot.count for slot in self.slots)

    @property
    def size(self) -> int:
        last = self.slots[-1]
        return last.payload_position + last.payload_length

    @property
    def payload_bytes(self) -> int:
        """Bytes of the frames' payloads (what StreamLog.can_adopt weighs)."""
        return sum(slot.payload_length for slot in self.slots)

    def read_payload(self, slot: FrameSlot) -> bytes:
        """One frame's payload (for a size check or ids that need the rows)."""
        with open(self.path, "rb") as handle:
            handle.seek(slot.payload_position)
            return handle.read(slot.payload_length)

    def stamp(self, first: int, timestamp: int,
              stored_schema: StoredSchemas = _message_schema) -> Stamp:
        """Stamp offsets first.. and ``timestamp`` into the file, fsync it.

        Only the offset and timestamp columns and the headers are written; the
        payloads are not read (their CRCs are patched: crc_patch.py), except
        for frames flagged as carrying producer ids, whose (offset, id)
        columns are returned for the dedup window (decoded in
        ``stored_schema(version)``, the frame's schema). ValueError when the file
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
            offsets = np.arange(base, base + slot.count, dtype="<i8")
            timestamps = np.full(slot.count, timestamp, dtype="<i8")
            crc = crc_patch.patch(
                stamp.payload_crc, slot.payload_length, stamp.offsets_position,
                np.arange(stamp.placeholder_base, stamp.placeholder_base + slot.count,
                          dtype="<i8"), offsets)
            crc = crc_patch.patch(crc, slot.payload_length, stamp.timestamps_position,
                                  np.zeros(slot.count, dtype="<i8"), timestamps)
            header_bytes, header = encode_header_for_crc(FrameHeader(
                slot.flags, slot.payload_length, crc, base, slot.count, timestamp, timestamp,
                slot.schema_version))
            if slot.flags & FLAG_PRODUCER_IDS:
                flagged.append(self._ids(slot, base, timestamp,
                                         stored_schema(slot.schema_version)))
            faults.hit("storage.write", self.path, slot.header_position)
            (header_at, _), (offsets_at, _), (timestamps_at, _) = slot.stamped_ranges()
            patches += [(header_at, header_bytes), (offsets_at, offsets),
                        (timestamps_at, timestamps)]
            headers.append((slot.header_position, header))
            base += slot.count
        # Only the headers and the two stamped columns are written: the rest of the file
        # stays as Stage wrote it (and, written directly, out of the page cache).
        (_DIRECT if self.direct else _PAGE_CACHE).patch(
            self.path, patches, lambda: faults.hit("storage.fsync", self.path, self.size),
            self.known_blocks)
        faults.hit("storage.stamped", self.path)
        return headers, flagged

    def _ids(self, slot: FrameSlot, base: int, timestamp: int,
             schema: pa.Schema) -> pa.RecordBatch:
        """The (offset, id) columns of a flagged frame, as stamped (read back for them)."""
        batch = stamp_payload(memoryview(bytearray(self.read_payload(slot))), base, timestamp,
                              schema)
        if batch.num_rows != slot.count:
            raise ValueError(f"staged frame at byte {slot.payload_position} of {self.path} "
                             f"holds {batch.num_rows} rows, not {slot.count}")
        return batch.select(_ID_COLUMNS)


Stamp = tuple[list[tuple[int, FrameHeader]], list[pa.RecordBatch]]  # StagedSegment.stamp's result


@dataclass(frozen=True)
class TypedFrames:
    """How a typed stream's staged rows are framed: their schema version and its stored schema."""

    version: int
    stored: pa.Schema


def build_staged_frames(rows: pa.Table, first: int, position: int, max_frame_bytes: int,
                        id_prefix: bytes, typed: TypedFrames | None = None,
                        ) -> tuple[list[ReadableBuffer], list[FrameSlot]]:
    """Publish rows as frames of a staged segment: the buffers to write, and each frame's slot.

    The rows (publish columns, completed here) get the placeholder offsets
    ``first``.. (ids generated for rows without one come from them and
    ``id_prefix``, so ``first`` keeps them unique within a file) and
    timestamps 0. They are cut into frames of about ``max_frame_bytes``, as
    an append cuts a batch, each behind a placeholder header and flagged when
    a row carries a producer id. The buffers go back to back from file
    position ``position``; the slots record where each payload lands and
    what stamping it needs (StampSlot).

    ``typed``: the rows' value is a typed stream's struct of that schema
    version (already converted and checked); the frames are then in its
    stored schema and carry the version.
    """
    version, schema = (typed.version, typed.stored) if typed else (0, MESSAGE_SCHEMA)
    if typed is None:
        rows = complete_publish_table(rows)
        sizes = message_sizes(rows)
    else:
        rows = complete_publish_table(rows, typed_publish_schema(schema.field("value").type))
        sizes = message_sizes(rows, value_sizes=value_sizes(rows.column("value")))
    ids = rows.column("id").chunk(0)
    supplied = producer_id_mask(ids) if ids.null_count < len(ids) else None
    batch = build_message_batch(rows, first, 0, id_prefix, schema)
    pieces: list[ReadableBuffer] = []
    slots: list[FrameSlot] = []
    # Cut as an append cuts (frame_slices), sized without serializing the whole batch.
    slices = frame_slices(batch.num_rows, pa.ipc.get_record_batch_size(batch), max_frame_bytes)
    for start, count in slices:
        piece = batch if count == batch.num_rows else batch.slice(start, count)
        flags = 0
        if supplied is not None and pc.any(supplied.slice(start, count)).as_py():
            flags = FLAG_PRODUCER_IDS
        payload = piece.serialize()
        _batch, ((offsets_at, _), (timestamps_at, _)) = stamp_ranges(payload, schema)
        pieces += [placeholder_header(payload.size, count, flags, version), payload]
        position += HEADER_SIZE
        slots.append(FrameSlot(
            position, payload.size, count, flags, int(sizes[start:start + count].max()),
            StampSlot(first + start, offsets_at, timestamps_at, crc32c.crc32c(payload)),
            version))
        position += payload.size
    return pieces, slots


def stamp_all(jobs: Sequence[tuple[StagedSegment, int]], timestamp: int,
              stored_schema: StoredSchemas = _message_schema) -> list[Stamp]:
    """Stamp each (file, first offset) of one append, concurrently; results in order.

    A stamp mostly waits on the disk (a few block reads and writes, an
    fdatasync), so a micro-batch's dozens of files are stamped by a few
    threads at once. The first failure is raised once all are done.
    """
    if len(jobs) <= 1:
        return [staged.stamp(first, timestamp, stored_schema) for staged, first in jobs]
    with ThreadPoolExecutor(min(STAMP_THREADS, len(jobs)),
                            thread_name_prefix="stamp") as pool:
        futures = [pool.submit(staged.stamp, first, timestamp, stored_schema)
                   for staged, first in jobs]
    return [future.result() for future in futures]


def check_sizes(parts: Sequence[PrebuiltFrame | StagedSegment], stream: str, limit: int,
                stored_schema: StoredSchemas = _message_schema) -> None:
    """MessageTooLargeError for the first message over ``limit`` (0 = none), as append does.

    Frames carry their largest message size, so only a frame over the limit
    (the stream's limit was lowered after they were staged) is decoded (in
    ``stored_schema(version)``); its rows are then measured and compared by
    the one rule (npstream.proto.message_size), and the index is the
    message's in the append.
    """
    if limit <= 0:
        return
    index = 0
    for part in parts:
        pieces = ([(part.count, part.max_message_bytes, part.schema_version,
                    lambda part=part: part.payload)]
                  if isinstance(part, PrebuiltFrame) else
                  [(slot.count, slot.max_message_bytes, slot.schema_version,
                    lambda part=part, slot=slot: part.read_payload(slot)) for slot in part.slots])
        for count, largest, version, payload in pieces:
            if largest > limit:
                rows = pa.Table.from_batches([decode_payload(payload(), stored_schema(version))])
                sizes = message_sizes(rows, value_sizes=value_sizes(rows.column("value"))
                                      if version else None)
                row = first_oversized(sizes, limit)
                if row is not None:
                    raise MessageTooLargeError(stream, index + row, int(sizes[row]), limit)
            index += count

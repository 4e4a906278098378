"""The staging file format: a stage's rows as ready-to-append frames, per stream.

A commit used to re-read every staged row, complete its columns, generate ids,
build and serialize stored batches and write them: the rows were encoded twice
and copied several times, all while every Spark task of the micro-batch
waited. Now Stage does that work once, in parallel with the tasks, and stores
the result: for each target stream, frames in the segment layout
(storage/record_batch.py) whose payloads are MESSAGE_SCHEMA record-batch
messages with placeholder offsets (0..) and timestamps (0), and final ids
(rows staged without an id get one here: 16 random hex characters chosen per
staging file and stream, then the row's index as 16 hex digits, the shape of
the broker's generated ids). Each frame starts with a placeholder header
(storage/staged_segment.py): right length, count and flags, no offsets, no
CRC.

A file whose rows all go to one stream is therefore a segment once stamped:
a large one is adopted by the commit (stamped in place, renamed into the
stream directory: no copy, ``StreamLog.append_prebuilt`` with a
StagedSegment); a small one, or one routed to several streams, is mapped
copy-on-write and its payloads stamped and appended to the active segment.

Files (the data file appears last, so its presence means the staging exists)::

    <staging_id>.arrow   the frames, from byte 0, per target stream in name order,
                         each stream's rows in staged order
    <staging_id>.index   JSON: {"format": 3, "rows": N, "bytes": size of the data file,
                         "streams": [sorted targets], "frames": [[stream, count, flags,
                         payload position, payload length, largest message bytes,
                         placeholder base offset, offsets position, timestamps position,
                         payload CRC32C], ...]}

The index stays a separate file because an adopted data file must hold
frames and nothing else; it outlives the data file until the batch is
dropped, so that a commit resumed after a crash still knows how many rows an
adopted staging held. Its last four fields per frame let the commit stamp
the file without reading it (staged_segment.py, crc_patch.py): the data file
is written around the page cache (storage/direct_write.py), so a read would
come from the disk.

Older formats are still read (files staged by older brokers), and copied,
never adopted: format 2, the same files without those four fields; format 1,
an Arrow IPC stream of the payloads with the same index in a trailer (the
index's JSON padded to 8 bytes, then u64 position of the index and the magic
b"NPSTG\x00\x00\x01"), and format 0, an Arrow IPC stream with a ``stream``
column (sink_staging.py).
"""

from __future__ import annotations

import json
import mmap
import os
import secrets
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import crc32c
import pyarrow as pa
import pyarrow.compute as pc

from npstream.broker.storage.batch_builder import (
    build_message_batch,
    complete_publish_table,
    message_sizes,
    producer_id_mask,
)
from npstream.broker.storage.direct_write import DirectFileWriter
from npstream.broker.storage.prebuilt import PrebuiltFrame, stamp_ranges
from npstream.broker.storage.staged_segment import (
    FrameSlot,
    StagedSegment,
    StampSlot,
    placeholder_header,
)
from npstream.proto.frames.payload import decode_payload
from npstream.proto.frames.record_batch import FLAG_PRODUCER_IDS, HEADER_SIZE

__all__ = ["FORMAT", "INDEX_SUFFIX", "MAGIC", "StagedFrames", "build_staging", "frame_slots",
           "index_path", "read_index"]

FORMAT = 3
INDEX_SUFFIX = ".index"
MAGIC = b"NPSTG\x00\x00\x01"  # format 1's trailer
_TRAILER = struct.Struct("<Q8s")
# Chunks smaller than this are grouped (one copy) so that frames are not tiny;
# bigger chunks become stored batches without being copied.
_MIN_PART_BYTES = 256 << 10
_ID_PREFIX_BYTES = 8  # random bytes -> 16 hex characters, as the broker's generated ids


def build_staging(table: pa.Table, max_frame_bytes: int) -> tuple[list[object], dict[str, object]]:
    """The data file of ``table`` (prepare_stage output) as buffers back to back, and its index.

    Stored batches are cut into payloads of about ``max_frame_bytes`` (the
    broker's max_batch_bytes), as an append would cut them.
    """
    streams = sorted(json.loads(table.schema.metadata[b"npstream.streams"]))
    pieces: list[object] = []
    frames: list[list[object]] = []
    position = 0
    for stream in streams:
        rows = table
        if len(streams) > 1:
            rows = table.filter(pc.equal(table.column("stream"), stream))
        id_prefix = secrets.token_hex(_ID_PREFIX_BYTES).encode()
        first = 0
        for part in _parts(rows.drop_columns(["stream"])):
            part = complete_publish_table(part)
            ids = part.column("id").chunk(0)
            supplied = producer_id_mask(ids) if ids.null_count < len(ids) else None
            sizes = message_sizes(part)
            # Placeholder offsets first.. keep the generated ids unique within the file.
            batch = build_message_batch(part, first, 0, id_prefix)
            for start, count in _frame_slices(batch, max_frame_bytes):
                piece = batch if count == batch.num_rows else batch.slice(start, count)
                flags = 0
                if supplied is not None and pc.any(supplied.slice(start, count)).as_py():
                    flags = FLAG_PRODUCER_IDS
                payload = piece.serialize()
                _batch, ((offsets_at, _), (timestamps_at, _)) = stamp_ranges(payload)
                pieces += [placeholder_header(payload.size, count, flags), payload]
                position += HEADER_SIZE
                frames.append([stream, count, flags, position, payload.size,
                               int(sizes[start:start + count].max()), first + start,
                               offsets_at, timestamps_at, crc32c.crc32c(payload)])
                position += payload.size
            first += part.num_rows
    return pieces, {"format": FORMAT, "rows": table.num_rows, "bytes": position,
                    "streams": streams, "frames": frames}


def _parts(rows: pa.Table) -> Iterator[pa.Table]:
    """The rows in tables of whole chunks: big chunks alone (no copy), small ones grouped."""
    group: list[pa.RecordBatch] = []
    group_bytes = 0
    for batch in rows.to_batches():
        if not batch.num_rows:
            continue
        group.append(batch)
        group_bytes += batch.nbytes
        if group_bytes >= _MIN_PART_BYTES:
            yield pa.Table.from_batches(group)
            group, group_bytes = [], 0
    if group:
        yield pa.Table.from_batches(group)


def _frame_slices(batch: pa.RecordBatch, max_frame_bytes: int) -> list[tuple[int, int]]:
    """(first row, rows) of the frames of ``batch``: serialize_frames' cut, sized not serialized."""
    size = pa.ipc.get_record_batch_size(batch)
    if size <= max_frame_bytes or batch.num_rows <= 1:
        return [(0, batch.num_rows)]
    step = max(1, batch.num_rows * max_frame_bytes // size)
    return [(start, min(step, batch.num_rows - start))
            for start in range(0, batch.num_rows, step)]


def _index_position(handle: BinaryIO) -> int | None:
    """Where a format-1 file's index starts, from its trailer; None without one."""
    size = handle.seek(0, os.SEEK_END)
    if size < _TRAILER.size:
        return None
    handle.seek(size - _TRAILER.size)
    position, magic = _TRAILER.unpack(handle.read(_TRAILER.size))
    return position if magic == MAGIC and position <= size - _TRAILER.size else None


def index_path(path: Path) -> Path:
    """The index file next to a staging data file."""
    return path.with_suffix(INDEX_SUFFIX)


def read_index(path: Path) -> dict[str, object] | None:
    """The index of the staging whose data file is ``path``; None for a format-0 file.

    Formats 2 and 3 read the index file (the data file may be gone:
    adopted); format 1 the trailer. FileNotFoundError when neither file exists.
    """
    try:
        return json.loads(index_path(path).read_bytes())
    except FileNotFoundError:
        pass
    with open(path, "rb") as handle:
        position = _index_position(handle)
        if position is None:
            return None
        handle.seek(position)
        index = json.loads(handle.read()[:-_TRAILER.size])
    index["format"] = 1
    return index


def frame_slots(index: dict[str, object]) -> list[tuple[str, FrameSlot]]:
    """(target stream, slot) of every frame an index lists, in file order."""
    # Index entries: [stream, count, flags, payload position, payload length, largest,
    # then from format 3: placeholder base offset, offsets position, timestamps
    # position (both in the payload), payload CRC32C]
    return [(f[0], FrameSlot(f[3], f[4], f[1], f[2], f[5],
                             StampSlot(*f[6:10]) if len(f) >= 10 else None))
            for f in index["frames"]]  # type: ignore[attr-defined]


class StagedFrames:
    """A staging's frames: mapped copy-on-write to be stamped and copied, or adopted whole."""

    def __init__(self, staging_id: str, path: Path, index: dict[str, object],
                 writer: DirectFileWriter | None = None,
                 known_blocks: Mapping[int, bytes] | None = None) -> None:
        self.staging_id = staging_id
        self.path = path
        self._writer = writer  # how the data file was written: stamping writes alike
        self._known_blocks = known_blocks or {}  # blocks as Stage wrote them (stamping)
        self.format = int(index["format"])  # type: ignore[call-overload]
        self.streams: list[str] = list(index["streams"])  # type: ignore[call-overload]
        self.rows = int(index["rows"])  # type: ignore[call-overload]
        self._frames = frame_slots(index)
        self._map: mmap.mmap | None = None

    def count_for(self, stream: str) -> int:
        return sum(slot.count for target, slot in self._frames if target == stream)

    def bytes_for(self, stream: str) -> int:
        return sum(slot.payload_length for target, slot in self._frames if target == stream)

    def segment_for(self, stream: str) -> StagedSegment | None:
        """The data file as a segment to adopt for ``stream`` if it can be one.

        It can when it is in the segment layout with what stamping needs in
        its index (format 3) and holds rows of ``stream`` only. Format-2 files
        (staged by an older broker) are copied.
        """
        if self.format < FORMAT or self.streams != [stream]:
            return None
        return StagedSegment(self.path, tuple(slot for _target, slot in self._frames),
                             writer=self._writer, known_blocks=self._known_blocks)

    def _mapped(self) -> mmap.mmap | None:
        if self._map is None:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                end = max((slot.payload_position + slot.payload_length
                           for _target, slot in self._frames), default=0)
                if end > size:
                    raise ValueError(f"staging file {self.path} is cut short "
                                     f"({size} of {end} bytes)")
                self._map = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else None
            finally:
                os.close(fd)
        return self._map

    def frames_for(self, stream: str) -> list[PrebuiltFrame]:
        """This staging's frames for one stream, in staged order (writable views of the map)."""
        mapped = self._mapped()
        view = memoryview(mapped) if mapped is not None else memoryview(b"")
        return [PrebuiltFrame(view[slot.payload_position:slot.payload_position
                                   + slot.payload_length], slot.count, slot.flags,
                              slot.max_message_bytes)
                for target, slot in self._frames if target == stream]

    def rows_for(self, stream: str) -> pa.Table:
        """The rows for one stream as publish columns (id, key, value, headers)."""
        batches = [decode_payload(pa.py_buffer(frame.payload))
                   for frame in self.frames_for(stream)]
        table = pa.Table.from_batches(batches) if batches else None
        if table is None:
            return pa.table({"id": pa.array([], pa.string()), "value": pa.array([], pa.binary())})
        return table.select(["id", "key", "value", "headers"])

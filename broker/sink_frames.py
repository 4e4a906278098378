"""The staging file format: a stage's rows as ready-to-append frame payloads, per stream.

A commit used to re-read every staged row, complete its columns, generate ids,
build and serialize stored batches and write them: the rows were encoded twice
and copied several times, all while every Spark task of the micro-batch
waited. Now Stage does that work once, in parallel with the tasks, and stores
the result: for each target stream, MESSAGE_SCHEMA record-batch messages (the
payload bytes a segment frame holds) with placeholder offsets (0..) and
timestamps (0), and final ids (rows staged without an id get one here: 16
random hex characters chosen per staging file and stream, then the row's index
as 16 hex digits, the shape of the broker's generated ids). The commit maps
the file copy-on-write and hands the payloads to
``StreamLog.append_prebuilt``, which stamps offsets and timestamps in place
and writes them (storage/prebuilt.py).

Layout (integers little-endian)::

    an Arrow IPC stream in MESSAGE_SCHEMA: the schema, an empty batch, then the
        stored batches, per target stream in name order, each stream's rows in
        staged order; every batch message is one frame payload
    index (JSON, padded with spaces to 8 bytes):
        {"rows": N, "streams": [sorted targets],
         "frames": [[stream, count, flags, position, length, largest message bytes], ...]}
    trailer (16 bytes): u64 byte position of the index, then the magic b"NPSTG\x00\x00\x01"

The batches are written straight from their Arrow buffers by the IPC writer
(no serialized copy in memory); the empty batch forces the schema out first
so that every batch's position is known. The bytes of a batch message are
those of ``RecordBatch.serialize()``, i.e. a frame payload.

Listing what a staging targets reads the trailer and the index only. Files
written by older brokers (an Arrow IPC stream with a ``stream`` column, ending
with the IPC end-of-stream marker) are still read: ``is_frames_file`` tells
them apart by the trailer's magic.
"""

from __future__ import annotations

import json
import mmap
import os
import secrets
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc

from npstream.broker.storage.batch_builder import (
    build_message_batch,
    complete_publish_table,
    decode_payload,
    message_sizes,
    producer_id_mask,
)
from npstream.broker.storage.prebuilt import PrebuiltFrame
from npstream.broker.storage.record_batch import FLAG_PRODUCER_IDS
from npstream.schema import MESSAGE_SCHEMA

__all__ = ["MAGIC", "StagedFrames", "is_frames_file", "read_index", "write_staging"]

MAGIC = b"NPSTG\x00\x00\x01"
_TRAILER = struct.Struct("<Q8s")
_EMPTY_BATCH = pa.RecordBatch.from_pylist([], MESSAGE_SCHEMA)
# Chunks smaller than this are grouped (one copy) so that frames are not tiny;
# bigger chunks become stored batches without being copied.
_MIN_PART_BYTES = 256 << 10
_ID_PREFIX_BYTES = 8  # random bytes -> 16 hex characters, as the broker's generated ids


@dataclass(frozen=True)
class _Frame:
    stream: str
    count: int
    flags: int
    position: int
    length: int
    max_message_bytes: int


def write_staging(sink: pa.NativeFile, table: pa.Table, max_frame_bytes: int) -> None:
    """Write the staging file of ``table`` (prepare_stage output) to ``sink`` (at position 0).

    Stored batches are cut into payloads of about ``max_frame_bytes`` (the
    broker's max_batch_bytes), as an append would cut them.
    """
    streams = sorted(json.loads(table.schema.metadata[b"npstream.streams"]))
    frames: list[list[object]] = []
    with pa.ipc.new_stream(sink, MESSAGE_SCHEMA) as writer:
        writer.write_batch(_EMPTY_BATCH)
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
                    position = sink.tell()
                    writer.write_batch(piece)
                    frames.append([stream, count, flags, position, sink.tell() - position,
                                   int(sizes[start:start + count].max())])
                first += part.num_rows
    index_position = sink.tell()
    text = json.dumps({"rows": table.num_rows, "streams": streams, "frames": frames}).encode()
    sink.write(text + b" " * (-len(text) % 8))
    sink.write(_TRAILER.pack(index_position, MAGIC))


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
    """Where the index starts, from the trailer; None when the file has no trailer."""
    size = handle.seek(0, os.SEEK_END)
    if size < _TRAILER.size:
        return None
    handle.seek(size - _TRAILER.size)
    position, magic = _TRAILER.unpack(handle.read(_TRAILER.size))
    return position if magic == MAGIC and position <= size - _TRAILER.size else None


def is_frames_file(path: Path) -> bool:
    """True for a staging file in this format (False: an older Arrow IPC stream file)."""
    with open(path, "rb") as handle:
        return _index_position(handle) is not None


def read_index(path: Path) -> dict[str, object]:
    """The JSON index of a staging file in this format (a few hundred bytes read)."""
    with open(path, "rb") as handle:
        position = _index_position(handle)
        if position is None:
            raise ValueError(f"{path} is not a staging file in the frames format")
        handle.seek(position)
        return json.loads(handle.read()[:-_TRAILER.size])


class StagedFrames:
    """A staging file mapped copy-on-write: its payloads can be stamped without touching it."""

    def __init__(self, staging_id: str, path: Path) -> None:
        self.staging_id = staging_id
        index = read_index(path)
        self.streams: list[str] = list(index["streams"])  # type: ignore[call-overload]
        self.rows = int(index["rows"])  # type: ignore[call-overload]
        self._frames = [_Frame(*f) for f in index["frames"]]  # type: ignore[attr-defined]
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            self._map = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else None
        finally:
            os.close(fd)
        end = max((f.position + f.length for f in self._frames), default=0)
        if end > size:
            raise ValueError(f"staging file {path} is cut short ({size} of {end} bytes)")

    def frames_for(self, stream: str) -> list[PrebuiltFrame]:
        """This staging's frames for one stream, in staged order (writable views of the map)."""
        view = memoryview(self._map) if self._map is not None else memoryview(b"")
        return [PrebuiltFrame(view[f.position:f.position + f.length], f.count, f.flags,
                              f.max_message_bytes)
                for f in self._frames if f.stream == stream]

    def rows_for(self, stream: str) -> pa.Table:
        """The rows for one stream as publish columns (id, key, value, headers)."""
        batches = [decode_payload(pa.py_buffer(frame.payload))
                   for frame in self.frames_for(stream)]
        table = pa.Table.from_batches(batches) if batches else None
        if table is None:
            return pa.table({"id": pa.array([], pa.string()), "value": pa.array([], pa.binary())})
        return table.select(["id", "key", "value", "headers"])

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

    0   8  magic  b"NPSTG\\x00\\x00\\x01"
    8   4  index_length: bytes of the JSON index that follows (padded with spaces to 8)
    12  4  reserved (0)
    16     index (JSON): {"rows": N, "streams": [sorted targets],
                          "frames": [[stream, count, flags, position, length,
                                      largest message bytes], ...]}
    ...    payloads at the listed byte positions (multiples of 8), streams in
           sorted order, each stream's frames in staged row order

Listing what a staging targets reads the index only. Files written by older
brokers (an Arrow IPC stream with a ``stream`` column) are still read:
``is_frames_file`` tells them apart by the magic.
"""

from __future__ import annotations

import json
import mmap
import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from npstream.broker.storage.batch_builder import (
    build_message_batch,
    complete_publish_table,
    decode_payload,
    message_sizes,
    producer_id_mask,
    serialize_frames,
)
from npstream.broker.storage.prebuilt import PrebuiltFrame
from npstream.broker.storage.record_batch import FLAG_PRODUCER_IDS

__all__ = ["MAGIC", "StagedFrames", "build_staging", "is_frames_file", "read_index"]

MAGIC = b"NPSTG\x00\x00\x01"
_PREFIX = struct.Struct("<8sII")
_ID_PREFIX_BYTES = 8  # random bytes -> 16 hex characters, as the broker's generated ids


@dataclass(frozen=True)
class _Frame:
    stream: str
    count: int
    flags: int
    position: int
    length: int
    max_message_bytes: int


def build_staging(table: pa.Table, max_frame_bytes: int) -> list[bytes | pa.Buffer]:
    """The pieces of a staging file for ``table`` (prepare_stage output), to write in order.

    Stored batches are cut into payloads of about ``max_frame_bytes`` (the
    broker's max_batch_bytes), as an append would cut them.
    """
    streams = sorted(json.loads(table.schema.metadata[b"npstream.streams"]))
    payloads: list[tuple[str, int, int, int, pa.Buffer]] = []
    for stream in streams:
        rows = table
        if len(streams) > 1:
            rows = table.filter(pc.equal(table.column("stream"), stream))
        rows = complete_publish_table(rows.drop_columns(["stream"]))
        if not rows.num_rows:
            continue
        ids = rows.column("id").chunk(0)
        supplied = producer_id_mask(ids) if ids.null_count < len(ids) else None
        sizes = message_sizes(rows)
        id_prefix = secrets.token_hex(_ID_PREFIX_BYTES).encode()
        batch = build_message_batch(rows, 0, 0, id_prefix)
        for start, count, payload in serialize_frames(batch, max_frame_bytes):
            flags = 0
            if supplied is not None and pc.any(supplied.slice(start, count)).as_py():
                flags = FLAG_PRODUCER_IDS
            largest = int(sizes[start:start + count].max())
            payloads.append((stream, count, flags, largest, payload))
    return _assemble(table.num_rows, streams, payloads)


def _assemble(rows: int, streams: list[str],
              payloads: list[tuple[str, int, int, int, pa.Buffer]]) -> list[bytes | pa.Buffer]:
    """Prefix + index + payloads; the index lists positions, so it is sized first."""
    def index_bytes(data_start: int) -> bytes:
        frames, position = [], data_start
        for stream, count, flags, largest, payload in payloads:
            frames.append([stream, count, flags, position, payload.size, largest])
            position += payload.size
        text = json.dumps({"rows": rows, "streams": streams, "frames": frames}).encode()
        return text + b" " * (-len(text) % 8)

    index = index_bytes(0)
    while True:  # positions grow with the index's own length; settles in a step or two
        start = _PREFIX.size + len(index)
        again = index_bytes(start)
        if len(again) == len(index):
            index = again
            break
        index = again
    return [_PREFIX.pack(MAGIC, len(index), 0), index, *(p[4] for p in payloads)]


def is_frames_file(path: Path) -> bool:
    """True for a staging file in this format (False: an older Arrow IPC stream file)."""
    with open(path, "rb") as handle:
        return handle.read(len(MAGIC)) == MAGIC


def read_index(path: Path) -> dict[str, object]:
    """The JSON index of a staging file in this format (a few hundred bytes read)."""
    with open(path, "rb") as handle:
        magic, length, _reserved = _PREFIX.unpack(handle.read(_PREFIX.size))
        if magic != MAGIC:
            raise ValueError(f"{path} is not a staging file (magic {magic!r})")
        return json.loads(handle.read(length))


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

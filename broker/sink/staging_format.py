"""The staging file format: a stage's rows as ready-to-append frames, per stream.

Stage completes the rows' columns, generates ids and builds and serializes the
stored batches once, in parallel with the Spark tasks, so that a commit (which
every task of the micro-batch waits for) re-reads and re-encodes nothing. It
stores the result: for each target stream, frames in the segment layout whose
payloads are stored-batch messages (MESSAGE_SCHEMA, or a typed stream's
stored schema) with placeholder offsets (0..) and timestamps (0), and final
ids (rows staged without an id get one here: 16 random hex characters chosen
per staging file and stream, then the row's index as 16 hex digits, the
shape of the broker's generated ids). Each
frame starts with a placeholder header: right length, count and flags, no
offsets, no CRC. The frames themselves are storage's layout, built by
storage (storage/staged_segment.py); this module decides which rows go into
which file and writes down where each frame is.

A file whose rows all go to one stream is therefore a segment once stamped:
a large one is adopted by the commit (stamped in place, renamed into the
stream directory: no copy, a FramedAppend (storage/framed_append.py) with
a StagedSegment); a small one, or one routed to several streams, is mapped
copy-on-write and its payloads stamped and appended to the active segment.

Files (the data file appears last, so its presence means the staging exists)::

    <staging_id>.arrow   the frames, from byte 0, per target stream in name order,
                         each stream's rows in staged order
    <staging_id>.index   JSON: {"format": 3, "rows": N, "bytes": size of the data file,
                         "streams": [sorted targets], "frames": [[stream, count, flags,
                         payload position, payload length, largest message bytes,
                         placeholder base offset, offsets position, timestamps position,
                         payload CRC32C, value schema version], ...],
                         "schemas": {typed target: [version, value schema as DDL]}}

A typed target's frames are in the stored schema of the stream's value
schema version at Stage time (typed streams, docs/typed-streams.md) and
carry that version in their headers, as an append's would; the index keeps
the version's schema so that a commit can refuse a stream that no longer
has it (deleted and re-created meanwhile). Both additions are optional
(version 0, no schemas: untyped), so the format number did not change.

The index stays a separate file because an adopted data file must hold
frames and nothing else; it outlives the data file until the batch is
dropped, so that a commit resumed after a crash still knows how many rows an
adopted staging held. Its last four fields per frame let the commit stamp
the file without reading it (storage/staged_segment.py, proto/frames/crc_patch.py):
the data file is written around the page cache (storage/direct_write.py), so a
read would come from the disk.

Only this format is read. Staging written by an older broker (formats 0-2:
no index file, or an index of another format) is refused with
StagingFormatError naming its format and this one, and the first refusal is
logged; a query that re-stages the batch writes it anew, and the staging
sweep deletes the old files after ``sink_staging_ttl`` like any other.
Reading older formats as well cost a second commit path (rows re-encoded at
commit) for files no released broker wrote.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import secrets
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from npstream.broker.errors import StagingFormatError
from npstream.broker.sink.tuning import MIN_PART_BYTES
from npstream.broker.storage.prebuilt import PrebuiltFrame
from npstream.broker.storage.staged_segment import (
    FrameSlot,
    StagedSegment,
    StampSlot,
    build_staged_frames,
)
from npstream.proto.frames.payload import decode_payload
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.proto.value_schema import parse_schema, stored_schema, to_ddl

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer  # bytes, memoryview, mmap, pyarrow.Buffer...

    from npstream.broker.sink.staging import PreparedStage

__all__ = ["FORMAT", "INDEX_SUFFIX", "StagedFrames", "build_staging", "frame_slots",
           "index_path", "read_index"]

log = logging.getLogger(__name__)

FORMAT = 3
INDEX_SUFFIX = ".index"
# The <staging_id>.index JSON object (keys in the module doc); read back from JSON,
# so its values are untyped.
StagingIndex = dict[str, Any]
# Format 1 ended its data file with this magic (and kept its index inside);
# recognised only to name the format of what is refused.
_FORMAT_1_MAGIC = b"NPSTG\x00\x00\x01"
_ID_PREFIX_BYTES = 8  # random bytes -> 16 hex characters, as the broker's generated ids

_refusal_logged = threading.Event()


def build_staging(prepared: PreparedStage,
                  max_frame_bytes: int) -> tuple[list[ReadableBuffer], StagingIndex]:
    """The data file of ``prepared`` (prepare_stage output) as buffers back to back, and its index.

    Stored batches are cut into payloads of about ``max_frame_bytes`` (the
    broker's max_batch_bytes), as an append would cut them.
    """
    pieces: list[ReadableBuffer] = []
    frames: list[list[object]] = []
    schemas: dict[str, list[object]] = {}
    position = 0
    for target in prepared.targets:
        stream = target.stream
        typed = target.typed_frames
        if typed is not None and target.value_schema is not None:
            schemas[stream] = [target.schema_version, to_ddl(target.value_schema)]
        id_prefix = secrets.token_hex(_ID_PREFIX_BYTES).encode()
        first = 0
        for part in _parts(target.table):
            # Placeholder offsets first.. keep the generated ids unique within the file.
            buffers, slots = build_staged_frames(part, first, position, max_frame_bytes,
                                                 id_prefix, typed)
            pieces += buffers
            frames += [[stream, slot.count, slot.flags, slot.payload_position,
                        slot.payload_length, slot.max_message_bytes,
                        slot.stamp.placeholder_base, slot.stamp.offsets_position,
                        slot.stamp.timestamps_position, slot.stamp.payload_crc,
                        slot.schema_version]
                       for slot in slots]
            position = slots[-1].payload_position + slots[-1].payload_length
            first += part.num_rows
    return pieces, {"format": FORMAT, "rows": prepared.num_rows, "bytes": position,
                    "streams": prepared.streams, "frames": frames, "schemas": schemas}


def _parts(rows: pa.Table) -> Iterator[pa.Table]:
    """The rows in tables of whole chunks: big chunks alone (no copy), small ones grouped."""
    group: list[pa.RecordBatch] = []
    group_bytes = 0
    for batch in rows.to_batches():
        if not batch.num_rows:
            continue
        group.append(batch)
        group_bytes += batch.nbytes
        if group_bytes >= MIN_PART_BYTES:
            yield pa.Table.from_batches(group)
            group, group_bytes = [], 0
    if group:
        yield pa.Table.from_batches(group)


def index_path(path: Path) -> Path:
    """The index file next to a staging data file."""
    return path.with_suffix(INDEX_SUFFIX)


def read_index(path: Path) -> StagingIndex:
    """The index of the staging whose data file is ``path`` (which may be gone: adopted).

    FileNotFoundError when neither file exists; StagingFormatError for
    staging of an older format (module doc).
    """
    try:
        index = json.loads(index_path(path).read_bytes())
    except FileNotFoundError:
        if not path.exists():
            raise
        raise _refused(path, _format_without_index(path)) from None
    found = index.get("format") if isinstance(index, dict) else None
    if found != FORMAT:
        raise _refused(path, found if isinstance(found, int) else -1)
    return index


def _format_without_index(path: Path) -> int:
    """Format of a staging data file without an index file: 1 with its trailer, else 0."""
    try:
        with open(path, "rb") as handle:
            if handle.seek(0, os.SEEK_END) >= len(_FORMAT_1_MAGIC):
                handle.seek(-len(_FORMAT_1_MAGIC), os.SEEK_END)
                if handle.read() == _FORMAT_1_MAGIC:
                    return 1
    except FileNotFoundError:  # dropped meanwhile: still not a current staging
        pass
    return 0


def _refused(path: Path, found: int) -> StagingFormatError:
    """The error for staging of another format; the first one of the process is logged."""
    error = StagingFormatError(path, found, FORMAT)
    if not _refusal_logged.is_set():
        _refusal_logged.set()
        log.error("staging directory %s holds staging of an older broker (%s is in staging "
                  "format %d, this broker reads format %d only): commits listing it are "
                  "refused, and it is deleted by the staging sweep after sink_staging_ttl; "
                  "further refusals are not logged", path.parent, path.name, found, FORMAT)
    return error


def frame_slots(index: StagingIndex) -> list[tuple[str, FrameSlot]]:
    """(target stream, slot) of every frame an index lists, in file order."""
    # Index entries: [stream, count, flags, payload position, payload length, largest,
    # placeholder base offset, offsets position, timestamps position (both in the
    # payload), payload CRC32C, value schema version (absent before typed streams: 0)]
    return [(f[0], FrameSlot(f[3], f[4], f[1], f[2], f[5], StampSlot(*f[6:10]),
                             f[10] if len(f) > 10 else 0))
            for f in index["frames"]]


class StagedFrames:
    """A staging's frames: mapped copy-on-write to be stamped and copied, or adopted whole."""

    def __init__(self, staging_id: str, path: Path, index: StagingIndex, *,
                 direct: bool = False, known_blocks: Mapping[int, bytes] | None = None) -> None:
        self.staging_id = staging_id
        self.path = path
        self._direct = direct  # the data file was written around the page cache
        self._known_blocks = known_blocks or {}  # blocks as Stage wrote them (stamping)
        self.format = int(index["format"])
        self.streams: list[str] = list(index["streams"])
        self.rows = int(index["rows"])
        self._frames = frame_slots(index)
        # Typed targets: stream -> [schema version, value schema as DDL] (module doc).
        self._schemas: dict[str, list[Any]] = dict(index.get("schemas") or {})
        self._map: mmap.mmap | None = None

    def schema_for(self, stream: str) -> tuple[int, pa.Schema | None]:
        """(value schema version, value schema) the rows for ``stream`` were framed in.

        (0, None) for an untyped target. The schema is the one the stream had
        at Stage time; the commit compares it with the stream's version now.
        """
        entry = self._schemas.get(stream)
        if not entry:
            return 0, None
        return int(entry[0]), parse_schema(str(entry[1]))

    def count_for(self, stream: str) -> int:
        return sum(slot.count for target, slot in self._frames if target == stream)

    def segment_for(self, stream: str) -> StagedSegment | None:
        """The data file as a segment for ``stream``, if it holds rows of ``stream`` only.

        Whether it is then adopted or copied is storage's call
        (StreamLog.can_adopt).
        """
        if self.streams != [stream]:
            return None
        return StagedSegment(self.path, tuple(slot for _target, slot in self._frames),
                             direct=self._direct, known_blocks=self._known_blocks)

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
                              slot.max_message_bytes, slot.schema_version)
                for target, slot in self._frames if target == stream]

    def rows_for(self, stream: str) -> pa.Table:
        """The rows for one stream as publish columns (id, key, value, headers)."""
        _version, value_schema = self.schema_for(stream)
        schema = stored_schema(value_schema) if value_schema is not None else MESSAGE_SCHEMA
        batches = [decode_payload(pa.py_buffer(frame.payload), schema)
                   for frame in self.frames_for(stream)]
        table = pa.Table.from_batches(batches) if batches else None
        if table is None:
            return pa.table({"id": pa.array([], pa.string()), "value": pa.array([], pa.binary())})
        return table.select(["id", "key", "value", "headers"])

"""Staged sink data: what a Stage call stores, checked, on disk, until its batch commits.

A Spark task stages its rows before the driver knows whether the micro-batch
will commit, so staged data must survive a broker crash (the commit may come
after a restart) and must be cheap to drop (aborts, failed attempts). One
file per staging id does both: it appears atomically (write a temporary file,
fsync, rename, fsync the directory) before Stage replies, a re-sent staging id
replaces the earlier file, and dropping a batch is deleting a directory.

Layout::

    <data_dir>/sink/<sink_id>/<batch_id>/<staging_id>.arrow   the frames
    <data_dir>/sink/<sink_id>/<batch_id>/<staging_id>.index   their JSON index

The data file holds, per target stream, the rows as ready-to-append frames
(staging_format.py has the format and the reason); the index lists the target
streams, the row count and every frame, so listing what a staging targets
reads a few hundred bytes, not the data. A commit may move a data file into
a stream as a segment; its index stays until the batch is dropped. Staging
written by older brokers, in older formats, is refused (staging_format.py).

Rows staged without an id get one here, in the shape of the broker's
generated ids (16 random hex characters per file and stream, then the row's
index), so a commit rewritten after a crash stores the same ids. They are not
producer ids: the frames are not flagged for them, so the target's dedup
window does not have to remember them.

Everything a commit could fail on is checked here, at Stage time, so a commit
only moves bytes: the value column, stream names, routing and each stream's
``max_message_bytes``. A typed target's values (a struct column, or JSON
objects in bytes) are converted to its current value schema version's struct
here, as a publish converts them (docs/typed-streams.md). Any bad row rejects
the whole Stage (INVALID_ARGUMENT naming the row and the stream; reason
VALUE_MISMATCH with the field and the expected type for a typed value) and
nothing is stored.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from npstream.broker.errors import InvalidArgumentError, ValueMismatchError
from npstream.broker.sink.staging_format import (
    INDEX_SUFFIX,
    StagedFrames,
    build_staging,
    frame_slots,
    index_path,
    read_index,
)
from npstream.broker.sink.tuning import DEFAULT_MAX_FRAME_BYTES
from npstream.broker.storage.batch_builder import check_message_sizes
from npstream.broker.storage.direct_write import DirectFileWriter, WrittenBlocks, edge_blocks
from npstream.broker.storage.files import fsync_dir
from npstream.broker.storage.staged_segment import TypedFrames
from npstream.broker.storage.value_schemas import UNTYPED, ValueSchemas
from npstream.proto.message_size import message_sizes
from npstream.proto.names import NAME_RULE, STREAM_NAME_RE, validate_stream_name
from npstream.proto.schema import normalize_publish_table
from npstream.proto.value_schema import ValueMismatchError as SchemaValueMismatch
from npstream.proto.value_schema import stored_schema, value_sizes, value_struct

__all__ = [
    "STAGING_DIR",
    "STAGING_SUFFIX",
    "PreparedStage",
    "StageTarget",
    "StagingArea",
    "StagingFile",
    "TargetRows",
    "check_sink_id",
    "check_staging_id",
    "message_sizes",
    "prepare_stage",
    "remove_staging",
    "uncommitted_batches",
]

log = logging.getLogger(__name__)

STAGING_SUFFIX = ".arrow"
# The staging area's directory under the broker's data_dir.
STAGING_DIR = "sink"
_TMP_SUFFIX = ".tmp"
# Sink and staging ids become path components: the stream-name alphabet, which
# admits no separators and no leading dot.


def _check_id(kind: str, value: str) -> str:
    if not STREAM_NAME_RE.fullmatch(value):
        raise InvalidArgumentError(f"invalid {kind} {value!r}: use {NAME_RULE}")
    return value


def check_sink_id(sink_id: str) -> str:
    """The sink id, or InvalidArgumentError stating the rule (it names a directory)."""
    return _check_id("sink_id", sink_id)


def check_staging_id(staging_id: str) -> str:
    """The staging id, or InvalidArgumentError stating the rule (it names a file)."""
    return _check_id("staging_id", staging_id)


def check_batch_id(batch_id: int) -> int:
    if batch_id < 0:
        raise InvalidArgumentError(f"batch_id={batch_id} must be >= 0")
    return batch_id


# ---------------------------------------------------------------- validation


def _resolve_streams(table: pa.Table, default_stream: str) -> pa.ChunkedArray:
    """The target stream of every row: its ``stream`` value, else default_stream."""
    if "stream" not in table.column_names:
        if not default_stream:
            raise InvalidArgumentError(
                "no target stream: the data has no 'stream' column and the request names "
                "no default stream"
            )
        # repeat: far cheaper than filling an all-null column (measured ~40x on 40k rows)
        return pa.chunked_array([pa.repeat(pa.scalar(default_stream, pa.string()),
                                           table.num_rows)], pa.string())
    column = table.column("stream")
    if column.type != pa.string():
        try:
            column = column.cast(pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise InvalidArgumentError(
                f"column 'stream' has type {column.type}, expected string"
            ) from None
    if default_stream:
        column = pc.fill_null(column, default_stream)
    elif column.null_count:
        row = pc.index(pc.is_null(column), True).as_py()
        raise InvalidArgumentError(
            f"row {row} has no target stream: its 'stream' value is null and the request "
            "names no default stream"
        )
    return column


@dataclass(frozen=True)
class StageTarget:
    """What a Stage needs to know of a target stream (the service asks the registry)."""

    max_message_bytes: int
    schemas: ValueSchemas = UNTYPED  # the stream's value schemas; UNTYPED when untyped
    exists: bool = True  # False: the commit will auto-create it (untyped)


@dataclass(frozen=True)
class TargetRows:
    """One target stream's rows of a Stage, ready to be framed.

    ``table`` has publish columns (``value`` and whichever of ``id``, ``key``,
    ``headers`` were sent): for an untyped stream the value is binary, for a
    typed one the struct of ``schema_version`` (converted and checked here),
    whose schema ``value_schema`` is kept in the staging's index so that
    the commit can tell whether the stream still has that schema.
    """

    stream: str
    table: pa.Table
    schema_version: int = 0
    value_schema: pa.Schema | None = None

    @property
    def typed_frames(self) -> TypedFrames | None:
        """How storage frames these rows (None: untyped, MESSAGE_SCHEMA)."""
        if not self.schema_version or self.value_schema is None:
            return None
        return TypedFrames(self.schema_version, stored_schema(self.value_schema))


@dataclass(frozen=True)
class PreparedStage:
    """A Stage's rows per target stream, in stream-name order, each in staged order."""

    targets: tuple[TargetRows, ...]

    @property
    def num_rows(self) -> int:
        return sum(target.table.num_rows for target in self.targets)

    @property
    def streams(self) -> list[str]:
        return [target.stream for target in self.targets]

    def rows_for(self, stream: str) -> pa.Table:
        """One stream's rows (publish columns); KeyError when the Stage has none for it."""
        for target in self.targets:
            if target.stream == stream:
                return target.table
        raise KeyError(stream)


def prepare_stage(
    data: pa.Table,
    default_stream: str,
    target_of: Callable[[str], StageTarget],
) -> PreparedStage:
    """What to store for one Stage call: checked, routed, in each target's publish types.

    ``target_of(stream)`` describes a target (and raises StreamNotFoundError
    when the stream may not be auto-created). A typed target's values (a
    struct column, or JSON objects in bytes) become its current schema
    version's struct; any value that does not fit, or a struct for an
    untyped stream, rejects the whole Stage naming the row of the input.
    """
    if default_stream:
        _checked_stream_name(default_stream, "the request's default stream")
    streams = _resolve_streams(data, default_stream)
    try:
        table = normalize_publish_table(data.drop_columns(["stream"])
                                        if "stream" in data.column_names else data)
    except ValueError as exc:
        raise InvalidArgumentError(f"cannot stage: {exc}") from None
    routed = "stream" in data.column_names  # else every row goes to the default stream
    if routed:
        names = sorted(t for t in pc.unique(streams).to_pylist() if t is not None)
    else:
        names = [default_stream] if table.num_rows else []
    targets = []
    for name in names:
        rows: np.ndarray | None = None  # the input rows of this target; None: all of them
        if routed:
            rows = np.flatnonzero(pc.equal(streams, name).to_numpy(zero_copy_only=False))
            _checked_stream_name(name, f"row {int(rows[0])}")
        mine = table if rows is None or len(rows) == table.num_rows else table.take(rows)
        targets.append(_target_rows(name, mine, rows, table.num_rows, target_of(name)))
    return PreparedStage(tuple(targets))


def _target_rows(stream: str, table: pa.Table, rows: np.ndarray | None, input_rows: int,
                 target: StageTarget) -> TargetRows:
    """One target's rows in its publish types, sizes checked; errors name the input row."""
    def input_row(index: int) -> int:
        return int(rows[index]) if rows is not None else index

    value_type = table.schema.field("value").type
    version = target.schemas.current
    value_schema = target.schemas.values.get(version)
    if value_schema is None:
        if pa.types.is_struct(value_type):
            raise InvalidArgumentError(
                f"cannot stage for stream '{stream}': the value is a struct (a typed stream's "
                + ("record), but the stream is untyped (binary values); send bytes, or give "
                   "the stream a value schema (docs/typed-streams.md)" if target.exists else
                   "record), but the stream does not exist and would be created untyped; "
                   "create it with a value schema first (Spark: option createStream=true)")
                + "; nothing was staged")
        sizes = message_sizes(table)
    else:
        column = table.schema.get_field_index("value")
        try:
            values = value_struct(table.column(column), value_schema)
        except SchemaValueMismatch as exc:
            where = f"field '{exc.field}'" if exc.field else "the value"
            raise ValueMismatchError(
                f"row {input_row(exc.index)} for stream '{stream}' (value schema version "
                f"{version}): {where} {exc.problem}; expected {exc.expected}; nothing was "
                "staged") from None
        value_field = stored_schema(value_schema).field("value")
        if values.type != value_field.type:
            values = values.cast(value_field.type)
        table = table.set_column(column, value_field, values)
        sizes = message_sizes(table, value_sizes=value_sizes(values))
    if rows is not None:  # sizes at the input's rows (others 0), so the error names its row
        spread = np.zeros(input_rows, dtype=np.int64)
        spread[rows] = sizes
        sizes = spread
    check_message_sizes(sizes, stream, target.max_message_bytes, staged=True)
    return TargetRows(stream, table, version, value_schema)


def _checked_stream_name(name: str, where: str) -> None:
    try:
        validate_stream_name(name)
    except ValueError as exc:
        raise InvalidArgumentError(f"{where}: {exc}") from None


# ---------------------------------------------------------------- files


@dataclass(frozen=True)
class StagingFile:
    """One staged file on disk."""

    sink_id: str
    batch_id: int
    staging_id: str
    path: Path

    def mtime_ms(self) -> int:
        return int(self.path.stat().st_mtime * 1000)


class StagingArea:
    """The ``<data_dir>/sink`` tree. Thread-safe: each file is written via its own temp name."""

    def __init__(self, root: Path, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, *,
                 direct_writes: bool = True) -> None:
        self.root = Path(root)
        self.max_frame_bytes = max_frame_bytes
        # Data files are written around the page cache where the filesystem allows
        # (storage/direct_write.py has why); index files are small and go through it.
        self._writer = DirectFileWriter(direct_writes)
        # The blocks the commit's stamping patches at their edges, as Stage wrote them,
        # so stamping does not read them back from the disk (direct_write.py).
        self._written_blocks = WrittenBlocks()
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, sink_id: str, batch_id: int, staging_id: str) -> Path:
        return self.root / sink_id / str(batch_id) / f"{staging_id}{STAGING_SUFFIX}"

    def write(self, sink_id: str, batch_id: int, staging_id: str,
              table: PreparedStage) -> int:
        """Store durably (fsynced, renamed, directory fsynced); returns the file size."""
        target = self.path(sink_id, batch_id, staging_id)
        try:
            return self._write_once(target, table)
        except FileNotFoundError:
            # The batch directory vanished under us (its batch committed or was aborted
            # meanwhile): write it again; the sweep deletes it if it is never committed.
            return self._write_once(target, table)

    def _write_once(self, target: Path, table: PreparedStage) -> int:
        """Data file and index file through temporary names; the data file is renamed last."""
        self._make_dirs(target.parent)
        suffix = f".{uuid.uuid4().hex[:12]}{_TMP_SUFFIX}"
        tmp = target.with_name(target.name + suffix)
        tmp_index = target.with_name(index_path(target).name + suffix)
        try:
            pieces, index = build_staging(table, self.max_frame_bytes)
            stamped = [span for _stream, slot in frame_slots(index)
                       for span in slot.stamped_ranges()]
            created = self._writer.create_keeping(tmp, pieces, edge_blocks(stamped))
            with open(tmp_index, "wb") as handle:
                handle.write(json.dumps(index).encode())
                handle.flush()
                os.fsync(handle.fileno())
            # A re-sent staging id replaces the earlier files; without the old data file
            # first, a crash between the two renames could pair old data with a new index.
            target.unlink(missing_ok=True)
            os.replace(tmp_index, index_path(target))
            os.replace(tmp, target)
            self._written_blocks.remember(target, created)
        except BaseException:
            tmp.unlink(missing_ok=True)
            tmp_index.unlink(missing_ok=True)
            raise
        fsync_dir(target.parent)
        return int(index["bytes"])

    def _make_dirs(self, batch_dir: Path) -> None:
        """Create <sink_id>/<batch_id> and fsync each new directory's parent."""
        if batch_dir.is_dir():
            return
        created: list[Path] = []
        for directory in (batch_dir.parent, batch_dir):
            if not directory.is_dir():
                directory.mkdir(exist_ok=True)
                created.append(directory)
        for directory in created:
            fsync_dir(directory.parent)

    def exists(self, sink_id: str, batch_id: int, staging_id: str) -> bool:
        return self.path(sink_id, batch_id, staging_id).is_file()

    def targets(self, sink_id: str, batch_id: int, staging_id: str) -> list[str]:
        """The streams a staging file writes to (reads only its index)."""
        index = read_index(self.path(sink_id, batch_id, staging_id))
        return list(index["streams"])

    def read(self, sink_id: str, batch_id: int, staging_id: str) -> PreparedStage:
        """The staged rows per target stream, decoded back (for checks and tests)."""
        frames = self.open_frames(sink_id, batch_id, staging_id)
        return PreparedStage(tuple(
            TargetRows(stream, frames.rows_for(stream), *frames.schema_for(stream))
            for stream in frames.streams))

    def open_frames(self, sink_id: str, batch_id: int, staging_id: str) -> StagedFrames:
        """The staged frames (mapped only when copied); StagingFormatError for old staging.

        Opens a staging whose data file was adopted too (its index remains).
        """
        path = self.path(sink_id, batch_id, staging_id)
        return StagedFrames(staging_id, path, read_index(path), direct=self._writer.direct,
                            known_blocks=self._written_blocks.blocks(path))

    def drop(self, sink_id: str, batch_id: int, staging_ids: list[str] | None = None) -> int:
        """Delete the listed stagings of a batch (all when None); returns files deleted."""
        batch_dir = self.root / sink_id / str(batch_id)
        if not batch_dir.is_dir():
            return 0
        if staging_ids is None:
            dropped = sum(1 for p in batch_dir.iterdir() if p.name.endswith(STAGING_SUFFIX))
            shutil.rmtree(batch_dir, ignore_errors=True)
            self._remove_if_empty(batch_dir.parent)
            return dropped
        dropped = 0
        for staging_id in staging_ids:
            path = self.path(sink_id, batch_id, staging_id)
            if path.is_file():
                dropped += 1
            remove_staging(path)
        self._remove_if_empty(batch_dir)
        self._remove_if_empty(batch_dir.parent)
        return dropped

    def drop_up_to(self, sink_id: str, last_batch_id: int) -> int:
        """Delete every staging of batches <= last_batch_id (they can never commit now)."""
        sink_dir = self.root / sink_id
        if not sink_dir.is_dir():
            return 0
        dropped = 0
        for batch_dir in list(sink_dir.iterdir()):
            if batch_dir.name.isdigit() and int(batch_dir.name) <= last_batch_id:
                dropped += self.drop(sink_id, int(batch_dir.name))
        self._remove_if_empty(sink_dir)
        return dropped

    def files(self) -> Iterator[StagingFile]:
        """Every staging data file, in no particular order (temp files excluded)."""
        return self._entries(STAGING_SUFFIX)

    def temp_files(self) -> Iterator[Path]:
        """Leftovers of Stage calls interrupted before their rename."""
        return (item.path for item in self._entries(_TMP_SUFFIX))

    def orphan_indexes(self) -> Iterator[StagingFile]:
        """Index files without their data file: adopted by a commit, or a Stage cut short."""
        return (item for item in self._entries(INDEX_SUFFIX)
                if not item.path.with_suffix(STAGING_SUFFIX).exists())

    def _entries(self, suffix: str) -> Iterator[StagingFile]:
        for sink_dir in _subdirs(self.root):
            for batch_dir in _subdirs(sink_dir):
                if not batch_dir.name.isdigit():
                    continue
                for path in batch_dir.iterdir():
                    if path.name.endswith(suffix):
                        yield StagingFile(sink_dir.name, int(batch_dir.name),
                                          path.name[: -len(suffix)], path)

    def sinks(self) -> list[str]:
        return [p.name for p in _subdirs(self.root)]

    def remove_empty_dirs(self) -> None:
        for sink_dir in _subdirs(self.root):
            for batch_dir in _subdirs(sink_dir):
                self._remove_if_empty(batch_dir)
            self._remove_if_empty(sink_dir)

    @staticmethod
    def _remove_if_empty(directory: Path) -> None:
        with contextlib.suppress(OSError):  # not empty (or already gone): keep it
            directory.rmdir()


def uncommitted_batches(root: Path, stream: str,
                        committed: Mapping[str, int]) -> list[tuple[str, int]]:
    """(sink id, batch id) of the stagings under ``root`` holding rows for ``stream`` whose
    batch is above ``committed[sink id]`` (its last committed batch; -1 when absent).

    A stream move waits for these to commit before it copies the stream
    (cluster/move.py). Reads the small index files only.
    """
    found: list[tuple[str, int]] = []
    for sink_dir in _subdirs(root):
        last = committed.get(sink_dir.name, -1)
        for batch_dir in _subdirs(sink_dir):
            if not batch_dir.name.isdigit() or int(batch_dir.name) <= last:
                continue
            for index in batch_dir.glob(f"*{INDEX_SUFFIX}"):
                try:
                    streams = json.loads(index.read_bytes()).get("streams", [])
                except (OSError, ValueError, AttributeError):
                    continue  # being written or dropped right now
                if stream in streams:
                    found.append((sink_dir.name, int(batch_dir.name)))
                    break
    return sorted(found)


def _subdirs(directory: Path) -> list[Path]:
    try:
        return [p for p in directory.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return []


def remove_staging(path: Path) -> None:
    """Delete a staging's data file and its index file (either may be gone already)."""
    path.unlink(missing_ok=True)
    index_path(path).unlink(missing_ok=True)

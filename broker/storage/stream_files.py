"""The small per-stream files beside the segments, each replaced atomically (write + rename).

- ``start-offset``: ``{"start_offset": N}``, the logical start pointer moved by
  delete_before / delete_all. The effective start offset is max(pointer, base
  offset of the first segment), so deleting segments never needs it.
- ``retention.json``: the retention fields of the last StreamConfig the broker
  gave; lets retention cover streams that were not opened since the broker
  started. The registry's config stays the source of truth.
- ``clean-shutdown``: written when the log is closed cleanly and removed when
  it is opened: the tail segment's size, next offset and max timestamp. While
  it matches the tail, a bad frame there is corruption rather than a torn
  write, and retention can see the tail's age without opening the stream.
- ``log-extent``: the first segment's base offset and the tail segment's
  base, size and next offset, as last recorded: when the log is opened, when
  a segment is rolled, before segments are deleted from the head and before
  the end is cut back (truncate_to). The log on disk must never be less than
  it says (loader.py checks on every open), so a segment file removed or a
  tail cut short outside the broker is refused instead of served shorter,
  with offsets reused. A record that cannot be written is removed: a missing
  record only means the check is skipped, a stale one would refuse a good log.
  Rewritten in place at a fixed size (one sector), not replaced by a rename.
- ``schema.arrow``: MESSAGE_SCHEMA as an Arrow IPC stream with no batches, so
  the segment payloads can be decoded without this code; checked on open.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.ipc as ipc

from npstream.broker.errors import CorruptRecordError
from npstream.broker.storage.errors import UnreadableFile
from npstream.broker.storage.files import (
    CLEAN_SHUTDOWN_FILE,
    LOG_EXTENT_FILE,
    RETENTION_FILE,
    SCHEMA_FILE,
    START_OFFSET_FILE,
    fsync_dir,
    write_file_atomically,
)
from npstream.broker.storage.settings import StreamConfig
from npstream.proto.schema import MESSAGE_SCHEMA

__all__ = [
    "CleanShutdown",
    "LogExtent",
    "UnreadableFile",
    "check_schema",
    "read_clean_shutdown",
    "read_log_extent",
    "read_retention_config",
    "read_start_offset",
    "remove_clean_shutdown",
    "remove_log_extent",
    "remove_start_offset",
    "write_clean_shutdown",
    "write_log_extent",
    "write_retention_config",
    "write_schema",
    "write_start_offset",
]


@dataclass(frozen=True)
class CleanShutdown:
    segment: int  # base offset of the tail segment
    size: int
    next_offset: int
    max_timestamp: int


@dataclass(frozen=True)
class LogExtent:
    """What a stream's files held when last recorded; they may hold more, never less."""

    first_segment: int  # base offset of the first segment
    segment: int  # base offset of the tail segment
    size: int  # bytes of the tail segment
    next_offset: int  # the log's end offset


_Record = TypeVar("_Record", "CleanShutdown", "LogExtent")


def _read_record(path: Path, kind: type[_Record]) -> _Record | None:
    """The dataclass ``kind`` stored as JSON in ``path``; None if absent, UnreadableFile if
    it does not parse or its fields are not non-negative integers."""
    try:
        data = _read_json(path)
        if data is None:
            return None
        record = kind(**data)
    except (ValueError, TypeError) as exc:
        raise UnreadableFile(f"{path}: {exc}") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
               for v in asdict(record).values()):
        raise UnreadableFile(f"{path}: fields must be non-negative integers: {data}")
    return record


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (values untyped: the caller's dataclass checks them)."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data


def read_start_offset(directory: Path) -> int | None:
    """The persisted start pointer; CorruptRecordError if the file cannot be read."""
    path = directory / START_OFFSET_FILE
    try:
        data = _read_json(path)
        if data is None:
            return None
        value = data["start_offset"]
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"start_offset {value!r} is not an offset")
        return value
    except (ValueError, KeyError) as exc:
        raise CorruptRecordError(path, 0, f"unreadable start offset: {exc}") from None


def write_start_offset(directory: Path, offset: int) -> None:
    write_file_atomically(directory / START_OFFSET_FILE,
                          json.dumps({"start_offset": offset}).encode())


def remove_start_offset(directory: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory / START_OFFSET_FILE)


def read_retention_config(directory: Path) -> StreamConfig | None:
    """The last config given for this stream, None if absent or unreadable."""
    try:
        data = _read_json(directory / RETENTION_FILE)
        return StreamConfig(**data) if data is not None else None
    except (ValueError, TypeError):
        return None


@functools.lru_cache(maxsize=64)
def _config_json(config: StreamConfig) -> bytes:
    return json.dumps(asdict(config)).encode()


def write_retention_config(directory: Path, config: StreamConfig, *, new: bool = False) -> None:
    """Record the config retention uses while the stream is not open.

    ``new``: the stream directory was just made, so there is no file to
    replace atomically: written in place (a torn write reads as no file,
    and the log writes it again when it is next opened).
    """
    data = _config_json(config)
    if not new:
        write_file_atomically(directory / RETENTION_FILE, data, durable=False)
        return
    fd = os.open(directory / RETENTION_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_clean_shutdown(directory: Path) -> CleanShutdown | None:
    """The clean-shutdown marker; None if absent, UnreadableFile if garbled."""
    return _read_record(directory / CLEAN_SHUTDOWN_FILE, CleanShutdown)


def read_log_extent(directory: Path) -> LogExtent | None:
    """The recorded extent of the log; None if absent, UnreadableFile if garbled."""
    return _read_record(directory / LOG_EXTENT_FILE, LogExtent)


# log-extent is rewritten in place, padded to this size: within one disk sector, so
# that a crash leaves the old record or the new one, and no rename (on ext4 a
# rename over a file flushes its data: ~1 ms, at every open of a log).
_EXTENT_RECORD_BYTES = 192


def write_log_extent(directory: Path, extent: LogExtent, *, durable: bool) -> None:
    """Record ``extent``; if that fails, remove the old record and raise.

    ``durable``: before segments are deleted or the end is cut back, the lower
    record must be on disk first (else a crash leaves a record above the files).
    """
    path = directory / LOG_EXTENT_FILE
    data = json.dumps(asdict(extent)).encode().ljust(_EXTENT_RECORD_BYTES - 1) + b"\n"
    try:
        created = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, 0)
            if os.fstat(fd).st_size != len(data):
                os.ftruncate(fd, len(data))
            if durable:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        if durable and created:
            fsync_dir(directory)
    except OSError:
        remove_log_extent(directory)
        raise


def remove_log_extent(directory: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory / LOG_EXTENT_FILE)


def write_clean_shutdown(directory: Path, marker: CleanShutdown) -> None:
    """Record a clean close; the data it describes is already fsynced.

    No fsync of its own: if the marker is lost in a crash, recovery merely
    applies the torn-tail rule to a tail that has no torn write.
    """
    write_file_atomically(directory / CLEAN_SHUTDOWN_FILE, json.dumps(asdict(marker)).encode(),
                          durable=False)


def remove_clean_shutdown(directory: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory / CLEAN_SHUTDOWN_FILE)


def write_schema(directory: Path) -> None:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, MESSAGE_SCHEMA):
        pass
    write_file_atomically(directory / SCHEMA_FILE, sink.getvalue().to_pybytes())


def check_schema(directory: Path) -> None:
    """Refuse a stream directory written with another message schema."""
    path = directory / SCHEMA_FILE
    try:
        with ipc.open_stream(path.read_bytes()) as reader:
            schema = reader.schema
    except FileNotFoundError:
        return
    except pa.ArrowInvalid as exc:
        raise CorruptRecordError(path, 0, f"unreadable schema: {exc}") from None
    if not schema.equals(MESSAGE_SCHEMA):
        raise CorruptRecordError(path, 0, f"stored schema {schema} is not MESSAGE_SCHEMA")

"""File names and small-file helpers of a stream directory.

Layout (docs/format.md)::

    <data_dir>/streams/<name>/
        schema.arrow                       MESSAGE_SCHEMA (older brokers; absent = MESSAGE_SCHEMA)
        00000000000000000000.log           segment: frames, named by its base offset
        00000000000000000000.index         offset index (closed segments only)
        00000000000000000000.timeindex     time index (closed segments only)
        start-offset                       logical start pointer (after delete_before)
        retention.json                     last config given by the broker
        clean-shutdown                     tail segment state at the last clean close
        log-extent                         first segment and end last recorded (never less)

Base offsets are zero-padded to 20 digits (int64 max has 19) so that names sort
in offset order. Stream names are validated before they become paths:
validation is a security boundary.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from npstream.proto.names import validate_stream_name

__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "LOG_EXTENT_FILE",
    "OFFSET_INDEX_SUFFIX",
    "RETENTION_FILE",
    "SCHEMA_FILE",
    "SEGMENT_SUFFIX",
    "START_OFFSET_FILE",
    "TIME_INDEX_SUFFIX",
    "TMP_SUFFIX",
    "cut_file",
    "fsync_dir",
    "list_segment_bases",
    "offset_index_path",
    "segment_bases",
    "segment_file_sizes",
    "segment_path",
    "stream_dir",
    "streams_root",
    "time_index_path",
    "write_file_atomically",
]

SEGMENT_SUFFIX = ".log"
OFFSET_INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TMP_SUFFIX = ".tmp"
SCHEMA_FILE = "schema.arrow"
START_OFFSET_FILE = "start-offset"
RETENTION_FILE = "retention.json"
CLEAN_SHUTDOWN_FILE = "clean-shutdown"
LOG_EXTENT_FILE = "log-extent"
_BASE_DIGITS = 20


def streams_root(data_dir: Path) -> Path:
    return data_dir / "streams"


def stream_dir(data_dir: Path, name: str) -> Path:
    """The directory of stream ``name``; raises ValueError for a name that is not a stream name.

    Built from one joined string: ``root / name`` would intern the caller's
    ``name`` object itself (pathlib interns path parts), and the registry
    keeps every stream's name, so a million streams would leave a million
    entries in the interpreter's table of interned strings.
    """
    return Path(f"{streams_root(data_dir)}/{validate_stream_name(name)}")


def _base_name(base_offset: int) -> str:
    return f"{base_offset:0{_BASE_DIGITS}d}"


def segment_path(directory: Path, base_offset: int) -> Path:
    return directory / (_base_name(base_offset) + SEGMENT_SUFFIX)


def offset_index_path(directory: Path, base_offset: int) -> Path:
    return directory / (_base_name(base_offset) + OFFSET_INDEX_SUFFIX)


def time_index_path(directory: Path, base_offset: int) -> Path:
    return directory / (_base_name(base_offset) + TIME_INDEX_SUFFIX)


def list_segment_bases(directory: Path) -> list[int]:
    """Base offsets of the segment files in ``directory``, ascending; [] if it does not exist."""
    try:
        return segment_bases(os.listdir(directory))
    except FileNotFoundError:
        return []


def segment_bases(entries: list[str]) -> list[int]:
    """Base offsets of the segment files among a directory's ``entries``, ascending."""
    bases: list[int] = []
    for entry in entries:
        stem, dot, suffix = entry.partition(".")
        if dot and "." + suffix == SEGMENT_SUFFIX and len(stem) == _BASE_DIGITS and stem.isdigit():
            bases.append(int(stem))
    bases.sort()
    return bases


def segment_file_sizes(directory: Path) -> dict[Path, int]:
    """Size of every segment file in ``directory`` now; {} if it does not exist."""
    sizes: dict[Path, int] = {}
    for base in list_segment_bases(directory):
        path = segment_path(directory, base)
        try:
            sizes[path] = path.stat().st_size
        except FileNotFoundError:  # deleted by retention meanwhile
            continue
    return sizes


def cut_file(path: Path, size: int) -> None:
    """Cut ``path`` back to ``size`` bytes, durably.

    Storage cuts its own files through the segment it owns; this is for what
    lies outside a log's state, like the torn write a test fault leaves
    (npstream.broker.faults), which the next open must find and repair.
    """
    with open(path, "r+b") as handle:
        handle.truncate(size)
        handle.flush()
        os.fsync(handle.fileno())


def fsync_dir(directory: Path) -> None:
    """Make creations, renames and deletions in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content.

    Written to a temporary file in the same directory and renamed over the
    target; with ``durable`` the file and the directory are fsynced too.
    """
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)

"""What a stream's files must hold at least, and the checks recovery makes against it.

Two records say how far a log reached: the clean-shutdown marker (written
when the log is closed) and ``log-extent`` (written when it is opened, when a
segment is rolled, before segments are deleted from the head and before the
end is cut back; stream_files.py). Files can gain data after either was
written (appends), never lose any except through the broker's own deletions,
which lower the record first. So when the files hold less than a record says
(a segment file removed, a tail cut at a frame boundary or in the middle of a
frame), something outside the broker took acknowledged messages away; opening
the log anyway would serve a shorter log and hand the missing offsets to new
messages. Recovery refuses such a log (CorruptRecordError: the stream needs
repair) instead, naming the file, the positions and the record.

A marker older than the extent record is left over from an earlier close
whose removal a crash lost: it no longer describes the files and is ignored.
A record that does not parse is ignored with a WARNING: the data may be
intact, and a damaged bookkeeping file alone is no reason to refuse it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from npstream.broker.errors import CorruptRecordError
from npstream.broker.storage.files import CLEAN_SHUTDOWN_FILE, LOG_EXTENT_FILE, segment_path
from npstream.broker.storage.segment import Segment
from npstream.broker.storage.stream_files import (
    CleanShutdown,
    LogExtent,
    UnreadableFile,
    read_clean_shutdown,
    read_log_extent,
    write_log_extent,
)

__all__ = ["Recorded", "check_end", "check_first_segment", "check_tail_size", "extent_of",
           "read_records", "record_extent", "shortfall"]

log = logging.getLogger(__name__)

_Record = TypeVar("_Record", CleanShutdown, LogExtent)

_MARKER = "the clean-shutdown marker"
_EXTENT = "log-extent (written at the last open, roll, deletion or truncation)"


@dataclass(frozen=True)
class Recorded:
    """A record the files may exceed but never fall short of, and which file said so."""

    source: str
    segment: int  # base offset of the tail segment then
    size: int  # its bytes then
    next_offset: int  # the log's end offset then
    first_segment: int | None = None  # base offset of the first segment (extent only)


def _mtime_ns(path: Path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return -1


def _read_or_ignore(read: Callable[[Path], _Record | None], directory: Path, stream: str,
                    warn: bool, what: str, consequence: str) -> _Record | None:
    """``read(directory)``, or None (and a WARNING if ``warn``) when the file is garbled."""
    try:
        return read(directory)
    except UnreadableFile as exc:
        if warn:
            log.warning("stream %s: ignored an unreadable %s (%s); %s", stream, what, exc,
                        consequence)
        return None


def read_records(directory: Path, stream: str, *, warn: bool = True,
                 ) -> tuple[CleanShutdown | None, LogExtent | None, list[Recorded]]:
    """(the marker if it is current, the extent record, both as Recorded).

    ``warn``: log a WARNING for a record that does not parse (recovery does;
    a listing's peek leaves that to the open).
    """
    marker = _read_or_ignore(read_clean_shutdown, directory, stream, warn,
                             "clean-shutdown marker", "recovery checks the tail as after a crash")
    extent = _read_or_ignore(read_log_extent, directory, stream, warn, "log-extent record",
                             "its files are not checked against it this time")
    if (marker is not None and extent is not None
            and _mtime_ns(directory / CLEAN_SHUTDOWN_FILE)
            < _mtime_ns(directory / LOG_EXTENT_FILE)):
        marker = None  # left over from before the last open (module docstring)
    recorded = []
    if marker is not None:
        recorded.append(Recorded(_MARKER, marker.segment, marker.size, marker.next_offset))
    if extent is not None:
        recorded.append(Recorded(_EXTENT, extent.segment, extent.size, extent.next_offset,
                                 extent.first_segment))
    return marker, extent, recorded


def _missing(recorded: Recorded, what: str) -> str:
    return (f"{what}; {recorded.source} records offsets up to {recorded.next_offset} (tail "
            f"segment at offset {recorded.segment}, {recorded.size} bytes): acknowledged "
            f"messages are missing, and opening the log would reuse their offsets")


def check_first_segment(directory: Path, bases: list[int], start_pointer: int,
                        recorded: list[Recorded]) -> None:
    """Refuse segment files missing at the head (or all of them)."""
    for entry in recorded:
        if not bases:
            if entry.next_offset > start_pointer:
                raise CorruptRecordError(segment_path(directory, entry.segment), 0, _missing(
                    entry, "every segment file is missing"), short=True)
        elif entry.first_segment is not None and bases[0] > entry.first_segment:
            raise CorruptRecordError(
                segment_path(directory, entry.first_segment), 0,
                f"segment file missing: {entry.source} records the first segment at offset "
                f"{entry.first_segment}, but the first segment file starts at offset "
                f"{bases[0]}: offsets [{entry.first_segment}, {bases[0]}) are gone", short=True)


def check_tail_size(path: Path, base: int, file_size: int, recorded: list[Recorded]) -> None:
    """Refuse a tail segment shorter than recorded (cut at a frame boundary or mid-frame)."""
    for entry in recorded:
        if entry.segment == base and file_size < entry.size:
            raise CorruptRecordError(path, file_size, _missing(
                entry, f"the segment file has {file_size} bytes, {entry.size} were recorded"),
                short=True)


def check_end(path: Path, end: int, position: int, recorded: list[Recorded],
              bad_frame: str = "") -> None:
    """Refuse a log whose end is below a record; the scan stopped at ``position`` (at a
    bad frame: ``bad_frame`` says why, and no torn tail is cut below a record)."""
    for entry in recorded:
        if end < entry.next_offset:
            where = f"{bad_frame}; the frames before it end at offset {end}" if bad_frame \
                else f"the log ends at offset {end}"
            # A bad frame is cut by repair; without one, repair accepts the files.
            raise CorruptRecordError(path, position, _missing(entry, where),
                                     short=not bad_frame)


def shortfall(directory: Path, bases: list[int], start_pointer: int,
              recorded: list[Recorded]) -> str:
    """What the segment files fall short of a record by, from their names and sizes
    alone (no scan); "" when nothing shows."""
    try:
        check_first_segment(directory, bases, start_pointer, recorded)
        if bases:
            tail = segment_path(directory, bases[-1])
            check_tail_size(tail, bases[-1], os.stat(tail).st_size, recorded)
            check_end(tail, bases[-1], 0, [entry for entry in recorded
                                           if entry.segment > bases[-1]])
    except CorruptRecordError as exc:
        return str(exc)
    return ""


def extent_of(segments: list[Segment]) -> LogExtent | None:
    """The extent of a log made of ``segments`` (None: no segment)."""
    if not segments:
        return None
    tail = segments[-1]
    return LogExtent(segments[0].base_offset, tail.base_offset, tail.size, tail.next_offset)


def record_extent(directory: Path, extent: LogExtent | None, stream: str, *,
                  durable: bool, known: LogExtent | None = None) -> None:
    """Write ``extent`` (unless it is None or equals ``known``); on failure, no record stays.

    A failure is logged, not raised: the change that called this goes on (a
    deletion at a full disk must free space), and without a record only the
    check of the next open is skipped.
    """
    if extent is None or extent == known:
        return
    try:
        write_log_extent(directory, extent, durable=durable)
    except OSError as exc:
        log.warning("stream %s: could not record the log extent %s (%s); the next open "
                    "does not check the files against it", stream, extent, exc)

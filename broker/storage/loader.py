"""Opening a stream directory: recovery as an explicit step, and repair on request.

``load_log`` returns what it found and what it did:

- closed segments are taken from their sealed index files when those match
  the segment file (size and mtime); otherwise the segment is scanned (every
  frame's CRC checked), its indexes rebuilt and re-sealed;
- the tail (last) segment is always scanned. A bad frame there that looks like
  a write cut short by a crash - the frame runs past the end of the file, or
  it is the last frame and fails its CRC, or only zero bytes follow - and
  after which no intact frame follows (a torn write leaves garbage at the end
  only) is a *torn tail*: the file is truncated at that frame and one WARNING
  names the file, the byte position and the reason. A clean-shutdown marker matching the
  tail means no write was in flight, so there a bad frame is corruption;
- a bad frame anywhere else raises CorruptRecordError(path, position,
  detail): the stream does not open (the broker reports it as needing
  repair) and nothing is changed on disk.

``repair_log`` scans every segment, truncates at the first bad frame and
deletes the segments after it: the operator's explicit choice to drop
everything from the corruption on.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from npstream.broker.errors import CorruptRecordError
from npstream.broker.storage.extent_check import (
    check_end,
    check_first_segment,
    check_tail_size,
    extent_of,
    read_records,
    record_extent,
    shortfall,
)
from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.files import (
    TMP_SUFFIX,
    list_segment_bases,
    segment_path,
)
from npstream.broker.storage.segment import Segment
from npstream.broker.storage.sparse_index import IndexFileError
from npstream.broker.storage.stream_files import (
    LogExtent,
    check_schema,
    read_start_offset,
    remove_clean_shutdown,
    remove_log_extent,
    remove_start_offset,
    write_schema,
    write_start_offset,
)
from npstream.broker.storage.tuning import SCAN_CHUNK_BYTES
from npstream.proto.frames.reader import BadFrame, FrameReader
from npstream.proto.frames.record_batch import HEADER_SIZE, MAGIC

__all__ = ["LoadedLog", "load_log", "repair_log"]

log = logging.getLogger(__name__)


@dataclass
class LoadedLog:
    """The state recovered from a stream directory and what recovery did to it."""

    segments: list[Segment]
    start_offset: int
    end_offset: int
    valid_bytes: int = 0  # bytes of the tail segment kept
    truncated_bytes: int = 0  # bytes cut off a torn tail
    rebuilt_indexes: list[str] = field(default_factory=list)  # closed segments re-scanned
    directory_exists: bool = True  # False: a stream never written (no directory yet)


def _remove_temporaries(directory: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir(directory):
            if entry.endswith(TMP_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory / entry)


def _only_zeros_from(path: Path, position: int, cache: FileCache) -> bool:
    """True when every byte from ``position`` to the end of the file is zero."""
    with cache.borrow(path) as fd:
        end = os.fstat(fd).st_size
        while position < end:
            chunk = os.pread(fd, min(SCAN_CHUNK_BYTES, end - position), position)
            if not chunk or chunk.count(0) != len(chunk):
                return False
            position += len(chunk)
    return True


def intact_frame_after(path: Path, position: int, cache: FileCache) -> int | None:
    """Byte position of the first whole frame (header checks and CRC pass) after ``position``.

    Frames start at multiples of 8, so only those positions holding the magic
    are tried. A write cut short by a crash leaves garbage at the end of the
    file only; an intact frame after a bad one means the bad one was damaged
    in place (a bit flip in its length makes it look as if it ran past the end).
    """
    with cache.borrow(path) as fd:
        end = os.fstat(fd).st_size
        start = position + 8
        while start + HEADER_SIZE <= end:
            chunk = os.pread(fd, min(SCAN_CHUNK_BYTES, end - start), start)
            found = chunk.find(MAGIC)
            while found >= 0:
                candidate = start + found
                if candidate % 8 == 0:
                    reader = FrameReader(fd, candidate, end, read_size=SCAN_CHUNK_BYTES)
                    with contextlib.suppress(BadFrame):
                        if reader.next_frame() is not None:
                            return candidate
                found = chunk.find(MAGIC, found + 1)
            start += max(len(chunk) - len(MAGIC) + 1, 1)
    return None


def _torn_tail_refused(bad: BadFrame, path: Path, file_size: int, cache: FileCache) -> str:
    """Why the bad frame at the tail is not a torn write ("" when it is one)."""
    if not (bad.past_end or (bad.crc_mismatch and bad.frame_end == file_size)
            or _only_zeros_from(path, bad.position, cache)):
        return bad.detail
    intact = intact_frame_after(path, bad.position, cache)
    if intact is None:
        return ""
    return (f"{bad.detail}; an intact frame follows at byte {intact}, so this is damage "
            f"in place, not a write cut short at the end")


def _load_closed(
    directory: Path, base: int, next_base: int, cache: FileCache, index_interval: int,
    stream: str, rebuilt: list[str],
) -> Segment:
    try:
        segment = Segment.load_sealed(directory, base)
        if segment.next_offset != next_base:
            raise IndexFileError(
                f"ends at offset {segment.next_offset}, next segment at {next_base}"
            )
        return segment
    except IndexFileError as why:
        reason = str(why)
    segment, bad = Segment.scan(directory, base, cache, index_interval)
    if bad is not None:
        raise CorruptRecordError(segment.path, bad.position, bad.detail)
    if segment.is_empty or segment.next_offset != next_base:
        raise CorruptRecordError(
            segment.path, segment.size,
            f"segment holds offsets [{base}, {segment.next_offset}) but the next segment "
            f"starts at offset {next_base}",
        )
    segment.seal()
    rebuilt.append(segment.path.name)
    log.info("stream %s: rebuilt indexes of %s, offsets [%d, %d) (%s)",
             stream, segment.path.name, base, segment.next_offset, reason)
    return segment


def _synced_extent(segments: list[Segment], cache: FileCache, clean: bool,
                   known: LogExtent | None, stream: str) -> LogExtent | None:
    """The extent to record at open: only what is on disk for sure (None: keep the old record).

    After a crash the tail may hold writes never fsynced (``ack="write"``); the
    record, written without an fsync of its own, could reach the disk before
    them and a power loss would then leave a record above the files (a stream
    refused until repair). So the tail is fsynced first, unless the clean-shutdown
    marker says its close already did; one fsync per open after a crash only.
    """
    extent = extent_of(segments)
    if extent is None or extent == known or clean:
        return extent
    tail = segments[-1]
    try:
        tail.sync(cache)
    except OSError as exc:
        log.warning("stream %s: could not fsync %s before recording its extent (%s); the old "
                    "record stays", stream, tail.path, exc)
        return None
    return extent


def load_log(
    directory: Path, cache: FileCache, index_interval: int, stream: str
) -> LoadedLog:
    """Recover the log in ``directory`` (module docstring); CorruptRecordError if corrupt."""
    if not directory.exists():
        return LoadedLog([], 0, 0, directory_exists=False)
    check_schema(directory)
    _remove_temporaries(directory)
    pointer = read_start_offset(directory) or 0
    bases = list_segment_bases(directory)
    marker, extent, recorded = read_records(directory, stream)
    check_first_segment(directory, bases, pointer, recorded)
    if not bases:
        remove_clean_shutdown(directory)
        return LoadedLog([], pointer, pointer)
    result = LoadedLog([], 0, 0)
    for base, next_base in itertools.pairwise(bases):
        result.segments.append(
            _load_closed(directory, base, next_base, cache, index_interval, stream,
                         result.rebuilt_indexes)
        )
    tail_base = bases[-1]
    if result.segments and result.segments[-1].next_offset != tail_base:
        raise CorruptRecordError(segment_path(directory, tail_base), 0, "offsets do not continue")
    tail, bad = Segment.scan(directory, tail_base, cache, index_interval)
    file_size = os.stat(tail.path).st_size
    check_tail_size(tail.path, tail_base, file_size, recorded)
    clean = marker is not None and (marker.segment, marker.size) == (tail_base, file_size)
    if bad is not None:
        if clean:
            raise CorruptRecordError(tail.path, bad.position, bad.detail)
        check_end(tail.path, tail.next_offset, bad.position, recorded, bad.detail)
        refused = _torn_tail_refused(bad, tail.path, file_size, cache)
        if refused:
            raise CorruptRecordError(tail.path, bad.position, refused)
        tail.truncate_file(cache, bad.position)
        result.truncated_bytes = file_size - bad.position
        log.warning(
            "stream %s: recovery truncated a torn tail: %s at byte %d, %d bytes removed (%s); "
            "log ends at offset %d", stream, tail.path, bad.position, result.truncated_bytes,
            bad.detail, tail.next_offset,
        )
    check_end(tail.path, tail.next_offset, tail.size, recorded)
    tail.delete_index_files()
    result.valid_bytes = tail.size
    result.segments.append(tail)
    record_extent(directory, _synced_extent(result.segments, cache, clean, extent, stream), stream,
                  durable=False, known=extent)
    remove_clean_shutdown(directory)
    result.end_offset = tail.next_offset
    result.start_offset = min(max(pointer, bases[0]), result.end_offset)
    return result


def repair_log(
    directory: Path, cache: FileCache, index_interval: int, stream: str
) -> tuple[int, str]:
    """Truncate at the first bad frame and delete later segments; (bytes removed, "file@pos")."""
    if not directory.exists():
        return 0, ""
    try:
        check_schema(directory)
    except CorruptRecordError as exc:
        log.warning("stream %s: repair rewrote the schema file: %s", stream, exc)
        write_schema(directory)
    try:
        pointer = read_start_offset(directory)
    except CorruptRecordError as exc:
        log.warning("stream %s: repair removed the start offset pointer: %s", stream, exc)
        remove_start_offset(directory)
        pointer = None
    short = shortfall(directory, list_segment_bases(directory), pointer or 0,
                      read_records(directory, stream, warn=False)[2])
    if short:  # repair keeps what the files hold: later offsets are assigned again
        log.warning("stream %s: repair accepts files that hold less than recorded: %s",
                    stream, short)
    remove_clean_shutdown(directory)
    remove_log_extent(directory)
    bases = list_segment_bases(directory)
    for number, base in enumerate(bases):
        segment, bad = Segment.scan(directory, base, cache, index_interval)
        position = bad.position if bad is not None else segment.size
        later = bases[number + 1 :]
        continues = not later or (segment.next_offset == later[0] and not segment.is_empty)
        if bad is None and continues:
            continue
        detail = bad.detail if bad is not None else f"next segment starts at offset {later[0]}"
        removed = os.stat(segment.path).st_size - position
        for base_after in later:
            doomed = Segment(directory, base_after)
            removed += os.stat(doomed.path).st_size
            doomed.delete(cache)
        segment.truncate_file(cache, position)
        segment.delete_index_files()
        if pointer is not None and pointer > segment.next_offset:
            write_start_offset(directory, segment.next_offset)
        where = f"{segment.path.name}@{position}"
        log.warning(
            "stream %s: repair truncated the log at %s (%s): %d bytes and %d later segment(s) "
            "removed; log now ends at offset %d", stream, where, detail, removed, len(later),
            segment.next_offset,
        )
        return removed, where
    return 0, ""

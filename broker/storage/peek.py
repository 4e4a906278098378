"""A stream's stats read from its files, without opening (recovering) its log.

Listings describe every stream of a page: opening each one (loader.py: a
dozen file operations, a log object, its dedup window) costs ~1 ms here, so a
glob listing of 10,000 mostly idle streams took 15 s and filled the LRU of
open logs with streams nobody uses. A small stream with one segment (most
streams of a many-streams broker: a chat, a sensor) is instead described
from its directory listing, its start-offset file and one read of its
segment, every frame's header and CRC checked as recovery would. Anything
else (several segments, a large segment, a frame that fails a check, a
frame of several timestamps whose first message is not the start, files
holding less than their extent records: extent_check.py) answers None, and
the caller opens the log: the answer is always what opening it
would report.
"""

from __future__ import annotations

import os
from pathlib import Path

from npstream.broker.errors import CorruptRecordError
from npstream.broker.storage.extent_check import (
    check_end,
    check_first_segment,
    check_tail_size,
    read_records,
)
from npstream.broker.storage.files import (
    CLEAN_SHUTDOWN_FILE,
    LOG_EXTENT_FILE,
    START_OFFSET_FILE,
    segment_bases,
    segment_path,
)
from npstream.broker.storage.results import LogStats
from npstream.broker.storage.stream_files import read_start_offset
from npstream.broker.storage.tuning import PEEK_MAX_BYTES
from npstream.proto.frames.record_batch import HEADER_SIZE, FrameError, frame_crc, parse_header

__all__ = ["peek_stats"]



def peek_stats(directory: Path) -> LogStats | None:
    """The stats opening the log would give, or None when only opening can tell."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return LogStats(0, 0, 0, 0, 0, 0)  # never written
    bases = segment_bases(names)
    try:
        pointer = (read_start_offset(directory) or 0) if START_OFFSET_FILE in names else 0
    except CorruptRecordError:
        return None
    if not bases:
        return LogStats(pointer, pointer, 0, 0, 0, 0)
    if len(bases) > 1:
        return None
    try:
        with open(segment_path(directory, bases[0]), "rb") as segment:
            if os.fstat(segment.fileno()).st_size > PEEK_MAX_BYTES:
                return None
            data = segment.read()
    except FileNotFoundError:
        return None  # deleted or rolled meanwhile
    end = bases[0]
    start_ts = last_ts = -1
    position = 0
    start = max(pointer, bases[0])
    while position < len(data):
        if position + HEADER_SIZE > len(data):
            return None  # a torn tail: recovery decides
        try:
            header = parse_header(data, position)
        except FrameError:
            return None
        if (position + header.frame_size > len(data) or header.base_offset != end
                or frame_crc(data, position, header) != header.crc):
            return None
        if header.base_offset <= start < header.next_offset:
            if header.min_timestamp != header.max_timestamp and start != header.base_offset:
                return None  # the start message's own time needs decoding
            start_ts = header.min_timestamp
        last_ts = max(last_ts, header.max_timestamp)
        end = header.next_offset
        position += header.frame_size
    if LOG_EXTENT_FILE in names or CLEAN_SHUTDOWN_FILE in names:
        recorded = read_records(directory, "", warn=False)[2]
        try:  # files holding less than recorded: opening refuses them
            check_first_segment(directory, bases, pointer, recorded)
            check_tail_size(directory, bases[0], len(data), recorded)
            check_end(directory, end, len(data), recorded)
        except CorruptRecordError:
            return None
    start = min(start, end)
    if start == end:
        return LogStats(start, end, len(data), 0, 0, 1)
    return LogStats(start, end, len(data), start_ts, last_ts, 1)

"""Reading a log: offset ranges, timestamp lookups, over an immutable view of its segments.

Readers take no lock. The writer publishes a new ``LogView`` after every
write (data is visible to readers once written to the file, before any
fsync); a reader works on the view it picked up, which bounds the tail
segment to the bytes written when the view was made.

Cost of a read at offset ``o``: a binary search over segments, one over the
segment's offset index, a walk over at most one index interval of frame
headers, then the frames themselves - in practice one pread. Stored payloads
wholly inside the requested range are returned as they are (memoryviews of
the bytes read); only a batch cut by the range edges is decoded, sliced and
re-encoded.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path

import numpy as np
import pyarrow as pa

from npstream.broker.errors import CorruptRecordError, OffsetOutOfRangeError
from npstream.broker.storage.batch_builder import reencode_rows
from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.results import ReadResult, StoredRow
from npstream.broker.storage.segment import Segment
from npstream.broker.storage.tuning import LARGE_FRAME_BYTES, MIN_READ_BYTES
from npstream.broker.storage.value_schemas import UNTYPED, ValueSchemas
from npstream.proto.frames.payload import decode_payload
from npstream.proto.frames.reader import BadFrame
from npstream.proto.frames.record_batch import HEADER_SIZE, FrameHeader

__all__ = [
    "FileSpan",
    "LogView",
    "decode_frame",
    "iter_frames",
    "locate_range",
    "offset_for_timestamp",
    "read_stored_batches",
    "timestamp_at",
]

_base_offset = attrgetter("base_offset")
_max_timestamp = attrgetter("max_timestamp")


@dataclass(frozen=True, slots=True)
class LogView:
    """What readers may see: offsets [start, end) stored in ``segments``.

    ``recent`` holds the rows of the write that made this view (rows [end -
    count, end)), when they were few enough to keep: its stored batch, or for
    a lone message (small_append.py) the one row as Python values. A reader
    that follows the tail (a shared group woken by that write) takes them from
    memory instead of reading back and decoding the frame just written. They
    live in the view so that one read of ``SegmentStore.view`` gives rows and
    offsets that belong together.

    ``schemas`` are the stream's value schemas (value_schemas.py) when the
    view was made: every frame in it was written in one of their versions.
    """

    start: int
    end: int
    segments: tuple[Segment, ...]
    tail_size: int  # bytes of the last segment covered by this view
    recent: pa.RecordBatch | StoredRow | None = None
    schemas: ValueSchemas = UNTYPED

    def limit(self, number: int) -> int:
        """Readable bytes of segment ``number``."""
        return self.tail_size if number == len(self.segments) - 1 else self.segments[number].size

    def segment_number(self, offset: int) -> int:
        """Index of the segment holding ``offset`` (the last with base <= offset)."""
        return max(0, bisect_right(self.segments, offset, key=_base_offset) - 1)


def _segment_spans(view: LogView, offset: int, stop: int) -> Iterator[tuple[Segment, int, int]]:
    """(segment, start, end) byte ranges whose frames hold offsets [offset, stop).

    ``start`` is the indexed frame at or before ``offset`` (0 in later
    segments), ``end`` an indexed frame boundary at or after ``stop`` (or the
    readable end): at most an index interval to skip on each side.
    """
    if not view.segments or offset >= stop:
        return
    for number in range(view.segment_number(offset), len(view.segments)):
        segment = view.segments[number]
        if segment.base_offset >= stop:
            return
        limit = view.limit(number)
        start = segment.position_for(offset) if segment.base_offset <= offset else 0
        end = segment.position_bound_after(stop, limit) if stop < segment.next_offset else limit
        yield segment, start, end


def iter_frames(
    view: LogView, cache: FileCache, offset: int, *, read_size: int = MIN_READ_BYTES,
    stop: int | None = None, wants: Callable[[FrameHeader], bool] | None = None,
) -> Iterator[tuple[Segment, int, FrameHeader, memoryview]]:
    """Frames holding offsets >= ``offset`` (and < ``stop``), from the indexed position on.

    Ends before the first frame at or past ``stop`` or refused by ``wants``
    (given the header of each frame holding offsets >= ``offset``), without
    reading its payload. Frames of LARGE_FRAME_BYTES or more are read one
    pread each (FrameReader). Raises CorruptRecordError for a frame that
    fails its checks.
    """
    stop = view.end if stop is None else stop
    refused = False
    expected = -1  # where the previous frame of the span ended (-1: none yet)

    def wanted(header: FrameHeader) -> bool:
        """Refuse (stop before) a frame only when its header continues the frames before
        it: a header damaged in a trusted segment (its base offset changed) is read whole
        instead, and its CRC reports it, rather than ending the read early, silently.
        A span from an indexed position starts at a frame holding ``offset``, which
        is never refused (nor past ``stop``) unless damaged."""
        nonlocal refused
        if header.next_offset <= offset:
            return True  # skipped below (within an index interval of ``offset``)
        if header.base_offset != expected:
            return True
        if header.base_offset >= stop or (wants is not None and not wants(header)):
            refused = True
            return False
        return True

    for segment, start, end in _segment_spans(view, offset, stop):
        expected = segment.base_offset if start == 0 else -1
        try:
            for position, header, payload in segment.frames(
                cache, start, end, min(max(read_size, MIN_READ_BYTES), max(0, end - start)),
                wants=wanted, large_frame=LARGE_FRAME_BYTES,
            ):
                expected = header.next_offset
                if header.next_offset <= offset:
                    continue
                yield segment, position, header, payload
        except BadFrame as bad:
            raise CorruptRecordError(segment.path, bad.position, bad.detail) from None
        if refused:
            return


def _range_stop(view: LogView, stream: str, offset: int, max_messages: int,
                end_offset: int | None) -> int:
    """End of a read from ``offset``; OffsetOutOfRangeError outside [start, end]."""
    if offset < view.start or offset > view.end:
        raise OffsetOutOfRangeError(stream, offset, view.start, view.end)
    stop = view.end if end_offset is None else min(end_offset, view.end)
    return min(stop, offset + max(0, max_messages))


def decode_frame(view: LogView, segment: Segment, position: int, header: FrameHeader,
                 payload: memoryview | bytes) -> pa.RecordBatch:
    """The stored batch of a frame, decoded in its header's schema version (zero copy)."""
    if not header.schema_version:
        return decode_payload(payload)
    return decode_payload(payload, view.schemas.stored_schema(header.schema_version,
                                                              segment.path, position))


def read_stored_batches(
    view: LogView, cache: FileCache, stream: str, offset: int, *, max_messages: int,
    max_bytes: int, end_offset: int | None, whole: bool = False,
) -> ReadResult:
    """Stored batches covering [offset, min(end_offset, end)) within the given limits.

    Each batch is in the stored schema of its frame's version (``versions``,
    given when the view's stream is typed). ``whole``: batches are never cut
    to the range (the first may start before ``offset``, the last end past
    the range; ``next_offset`` is where the last one ends). For callers in
    the broker that slice the decoded batch themselves: cutting re-encodes
    the rows kept, which a shared group re-reading one message out of a
    stored batch of 10,000 paid per message.
    """
    stop = _range_stop(view, stream, offset, max_messages, end_offset)
    batches: list[bytes | memoryview] = []
    if stop <= offset:
        return ReadResult(batches, offset, 0)
    versions: list[int] | None = [] if view.schemas.typed else None
    position_offset = offset
    total_bytes = 0
    read_size = max(1, max_bytes) + HEADER_SIZE

    def fits(header: FrameHeader) -> bool:
        """False for a frame returned as stored that would go past ``max_bytes`` (not read)."""
        uncut = whole or (position_offset <= header.base_offset
                          and header.next_offset <= stop)
        if not batches or not uncut:
            return True  # the first frame, or one cut (re-encoded: size unknown until then)
        return total_bytes + header.frame_size - HEADER_SIZE <= max_bytes

    for segment, position, header, payload in iter_frames(
        view, cache, offset, read_size=read_size, stop=stop, wants=fits
    ):
        low = position_offset - header.base_offset
        high = min(stop, header.next_offset) - header.base_offset
        data: bytes | memoryview = payload
        if whole:
            low, high = 0, header.count
        elif low or high != header.count:
            data = reencode_rows(decode_frame(view, segment, position, header, payload), low,
                                 high)
        if len(data) + total_bytes > max_bytes:
            if batches:
                break
            if high - low > 1 and not whole:  # always return something, but no more than needed
                high = low + max(1, (high - low) * max_bytes // len(data))
                data = reencode_rows(decode_frame(view, segment, position, header, payload),
                                     low, high)
        batches.append(data)
        if versions is not None:
            versions.append(header.schema_version)
        total_bytes += len(data)
        position_offset = header.base_offset + high
        if position_offset >= stop or total_bytes >= max_bytes or high < header.count:
            break
    return ReadResult(batches, position_offset, position_offset - offset,
                      tuple(versions) if versions is not None else ())


@dataclass(frozen=True, slots=True)
class FileSpan:
    """Bytes [position, end_position) of a segment file: whole frames, all written."""

    path: Path
    position: int
    end_position: int


def locate_range(
    view: LogView, stream: str, offset: int, *, max_messages: int, end_offset: int | None,
) -> tuple[list[FileSpan], int]:
    """The file spans whose frames cover [offset, stop), and stop.

    For readers on this machine that read the frames themselves (local reads):
    no byte is read here. Spans start at an indexed frame at or before
    ``offset`` and end at an indexed frame boundary at or after ``stop`` (or
    at the written end), so the reader skips at most an index interval on
    each side and trims rows outside the range.
    """
    stop = _range_stop(view, stream, offset, max_messages, end_offset)
    if stop <= offset:
        return [], offset
    return [FileSpan(segment.path, start, end)
            for segment, start, end in _segment_spans(view, offset, stop) if end > start], stop


def offset_for_timestamp(view: LogView, cache: FileCache, timestamp_ms: int) -> int:
    """First offset >= start whose timestamp is >= ``timestamp_ms``; end if there is none."""
    segments = view.segments
    searchable = len(segments)
    if searchable and view.tail_size == 0:
        searchable -= 1  # an empty tail has no timestamps
    number = bisect_left(segments, timestamp_ms, hi=searchable, key=_max_timestamp)
    if number >= searchable:
        return view.end
    segment = segments[number]
    relative = segment.time_index.relative_offset_before(timestamp_ms)
    found = view.end
    for frame_segment, position, header, payload in iter_frames(
        view, cache, segment.base_offset + relative
    ):
        if header.max_timestamp < timestamp_ms:
            continue
        if header.min_timestamp >= timestamp_ms:
            found = header.base_offset
        else:
            batch = decode_frame(view, frame_segment, position, header, payload)
            timestamps = batch.column("timestamp").cast("int64")
            row = int(np.searchsorted(np.asarray(timestamps), timestamp_ms, side="left"))
            found = header.base_offset + row
        break
    return max(found, view.start)


def timestamp_at(view: LogView, cache: FileCache, offset: int) -> int:
    """Timestamp of the message at ``offset`` (which must be in [start, end))."""
    for segment, position, header, payload in iter_frames(view, cache, offset):
        if header.min_timestamp == header.max_timestamp:
            return header.min_timestamp
        batch = decode_frame(view, segment, position, header, payload)
        timestamps = batch.column("timestamp").cast("int64")
        return int(timestamps[offset - header.base_offset].as_py())
    return 0

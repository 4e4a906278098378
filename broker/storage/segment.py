"""One segment: a .log file of frames holding a contiguous range of offsets, and its indexes.

A stream's log is a list of segments; only the last (the *active* segment)
is written to. A segment's name is its base offset (files.py); it holds
offsets [base_offset, next_offset). When the active segment is rolled it is
fsynced and *sealed*: its offset and time indexes are written next to it
(sparse_index.py says when they are trusted later). The active segment's
indexes live in memory and are rebuilt by scanning it on open.

Writes go through the shared FileCache; a failed write is cut off again
(ftruncate to the previous size) so the file never keeps half a frame that
the in-memory state does not know about.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from npstream.broker import faults
from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.files import offset_index_path, segment_path, time_index_path
from npstream.broker.storage.offset_index import OffsetIndex
from npstream.broker.storage.sparse_index import IndexFileError, SegmentSeal
from npstream.broker.storage.time_index import TimeIndex
from npstream.broker.storage.tuning import SCAN_CHUNK_BYTES
from npstream.proto.frames.reader import BadFrame, FrameReader
from npstream.proto.frames.record_batch import FrameHeader

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer  # bytes, memoryview, mmap, pyarrow.Buffer...

__all__ = ["Segment", "pwrite_all"]

log = logging.getLogger(__name__)


class Segment:
    """In-memory state of one segment file; mutated only by its log's writer."""

    def __init__(self, directory: Path, base_offset: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.path = segment_path(directory, base_offset)
        self.size = 0  # bytes of valid frames
        self.next_offset = base_offset
        self.first_timestamp = -1  # min timestamp of the first frame; -1 when empty
        self.max_timestamp = -1
        self.offset_index = OffsetIndex()
        self.time_index = TimeIndex()
        self.sealed = False
        self._bytes_since_index = 0

    def __repr__(self) -> str:
        return f"Segment({self.path.name}, offsets [{self.base_offset}, {self.next_offset}), " \
               f"{self.size} bytes)"

    @property
    def is_empty(self) -> bool:
        return self.size == 0

    # ------------------------------------------------------------------ building

    def record_frame(self, position: int, header: FrameHeader, index_interval: int) -> None:
        """Account for the frame just written (or scanned) at ``position``."""
        if position != self.size or header.base_offset != self.next_offset:
            raise ValueError(
                f"{self.path}: frame at byte {position} with base offset {header.base_offset} "
                f"does not continue the segment (size {self.size}, next offset {self.next_offset})"
            )
        if not self.offset_index or self._bytes_since_index >= index_interval:
            relative = header.base_offset - self.base_offset
            self.offset_index.append(relative, position)
            self.time_index.append(header.min_timestamp, relative)
            self._bytes_since_index = 0
        self._bytes_since_index += header.frame_size
        self.size += header.frame_size
        self.next_offset = header.next_offset
        if self.first_timestamp < 0:
            self.first_timestamp = header.min_timestamp
        self.max_timestamp = max(self.max_timestamp, header.max_timestamp)

    @classmethod
    def scan(
        cls, directory: Path, base_offset: int, cache: FileCache, index_interval: int,
        *, end: int | None = None,
    ) -> tuple[Segment, BadFrame | None]:
        """Rebuild a segment by reading every frame; stop at the first bad one.

        Returns the segment covering the valid frames and the failure, if any
        (offsets that do not continue are reported as a bad frame too).
        """
        segment = cls(directory, base_offset)
        with cache.borrow(segment.path) as fd:
            limit = os.fstat(fd).st_size if end is None else end
            reader = FrameReader(fd, 0, limit, read_size=SCAN_CHUNK_BYTES)
            while True:
                try:
                    frame = reader.next_frame()
                except BadFrame as bad:
                    return segment, bad
                if frame is None:
                    return segment, None
                position, header, _payload = frame
                if header.base_offset != segment.next_offset:
                    return segment, BadFrame(
                        position,
                        f"base offset {header.base_offset} does not follow offset "
                        f"{segment.next_offset - 1}",
                    )
                segment.record_frame(position, header, index_interval)

    @classmethod
    def load_sealed(cls, directory: Path, base_offset: int) -> Segment:
        """A closed segment from its index files; IndexFileError unless they match the file."""
        segment = cls(directory, base_offset)
        try:
            stat = os.stat(segment.path)
        except FileNotFoundError:
            raise IndexFileError("segment file missing") from None
        offset_index, seal = OffsetIndex.read(offset_index_path(directory, base_offset))
        time_index, time_seal = TimeIndex.read(time_index_path(directory, base_offset))
        if seal != time_seal:
            raise IndexFileError(f"offset and time index seals differ: {seal} vs {time_seal}")
        if (seal.segment_size, seal.segment_mtime_ns) != (stat.st_size, stat.st_mtime_ns):
            raise IndexFileError(
                f"written for {seal.segment_size} bytes at mtime {seal.segment_mtime_ns}, "
                f"file has {stat.st_size} bytes at mtime {stat.st_mtime_ns}"
            )
        if seal.segment_size == 0 or not offset_index or len(offset_index) != len(time_index):
            raise IndexFileError("empty or inconsistent index")
        segment.size = seal.segment_size
        segment.next_offset = seal.next_offset
        segment.max_timestamp = seal.max_timestamp
        segment.offset_index = offset_index
        segment.time_index = time_index
        segment.first_timestamp = time_index.keys[0]
        segment.sealed = True
        return segment

    # ------------------------------------------------------------------ I/O

    def create_file(self, cache: FileCache) -> None:
        with cache.borrow(self.path, create=True):
            pass

    def write_frame(
        self, cache: FileCache, header_bytes: bytes, payload: ReadableBuffer, header: FrameHeader,
        index_interval: int,
    ) -> None:
        """Append one frame at the end of the segment; on error the file is cut back."""
        position = self.size
        with cache.borrow(self.path) as fd:
            try:
                faults.hit("storage.write", self.path, position)
                pwrite_all(fd, [header_bytes, payload], position)
            except OSError:
                try:
                    os.ftruncate(fd, position)
                except OSError as cleanup:
                    log.error("%s: could not cut a failed write back to byte %d: %s",
                              self.path, position, cleanup)
                raise
        self.record_frame(position, header, index_interval)

    def sync(self, cache: FileCache) -> None:
        """fdatasync the segment file (a segment deleted meanwhile needs none)."""
        try:
            with cache.borrow(self.path) as fd:
                faults.hit("storage.fsync", self.path, self.size)
                started = time.perf_counter()
                os.fdatasync(fd)
                if cache.on_sync is not None:
                    cache.on_sync(time.perf_counter() - started)
        except FileNotFoundError:
            return

    def seal(self) -> None:
        """Persist the indexes of this (now closed, fsynced) segment."""
        stat = os.stat(self.path)
        seal = SegmentSeal(stat.st_size, stat.st_mtime_ns, self.next_offset, self.max_timestamp)
        self.offset_index.write(offset_index_path(self.directory, self.base_offset), seal)
        self.time_index.write(time_index_path(self.directory, self.base_offset), seal)
        self.sealed = True

    def delete_index_files(self) -> None:
        for path in (offset_index_path(self.directory, self.base_offset),
                     time_index_path(self.directory, self.base_offset)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.sealed = False

    def delete(self, cache: FileCache) -> None:
        """Remove the segment file and its index files."""
        cache.forget(self.path)
        self.delete_index_files()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def truncate_file(self, cache: FileCache, position: int) -> None:
        with cache.borrow(self.path) as fd:
            os.ftruncate(fd, position)
            os.fdatasync(fd)

    # ------------------------------------------------------------------ reading

    def position_for(self, offset: int) -> int:
        """Byte position of the indexed frame at or before ``offset`` (walk from there)."""
        return self.offset_index.position_at_or_before(offset - self.base_offset)

    def position_bound_after(self, offset: int, limit: int) -> int:
        """A byte position no frame holding offsets below ``offset`` extends past.

        The first indexed frame starting after ``offset`` (frames are contiguous,
        so every earlier frame ends before it), else ``limit``.
        """
        index = self.offset_index
        entry = index.last_at_or_below(offset - self.base_offset) + 1
        if entry < len(index):
            return min(limit, index.values[entry])
        return limit

    def frames(
        self, cache: FileCache, start: int, end: int, read_size: int, *,
        wants: Callable[[FrameHeader], bool] | None = None, large_frame: int = 0,
    ) -> Iterator[tuple[int, FrameHeader, memoryview]]:
        """Verified frames in [start, end); raises BadFrame at a bad one.

        Ends before the first frame ``wants`` refuses, without reading it;
        ``large_frame``: see FrameReader.
        """
        with cache.borrow(self.path) as fd:
            reader = FrameReader(fd, start, end, read_size=read_size, large_frame=large_frame)
            while (frame := reader.next_frame(wants)) is not None:
                yield frame


def pwrite_all(fd: int, buffers: Sequence[ReadableBuffer], position: int) -> None:
    """pwritev until every byte is written (regular files rarely write short).

    Empty buffers are skipped: pwritev of nothing returns 0, which would read as a
    write that made no progress (an empty staging file of a zero-row Stage did).
    """
    views = [view for view in (memoryview(buffer).cast("B") for buffer in buffers) if len(view)]
    while views:
        written = os.pwritev(fd, views, position)
        if written <= 0:
            raise OSError(errno.EIO, f"pwritev wrote nothing at byte {position}")
        position += written
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]

"""Create a file from a few buffers with O_DIRECT: durable bytes without filling the page cache.

The exactly-once sink stages every row a Spark task writes before anyone
reads it, and a large staged file later becomes a segment by being stamped in
place (staged_segment.py) - nothing needs those bytes in memory. Written
through the page cache, each staging first claims fresh cache pages, which
on the benchmark VM costs more than the rest of a Stage call together (first
touch of guest memory runs at ~400 MB/s there, a reused page at ~5 GB/s), and
then the fsync writes them out anyway. Written with O_DIRECT from a buffer
that is reused between calls, the bytes go from already-touched memory to
the disk.

O_DIRECT wants the buffer, the file position and the length aligned to the
device's block size; ALIGNMENT (4 KiB) covers the usual 512-byte and 4 KiB
devices. The pieces are copied into a page-aligned buffer, written with the
length rounded up, and the file truncated to its real size. Where the
filesystem refuses O_DIRECT (tmpfs, some network filesystems: EINVAL at open
or at the first write) the writer logs it once and writes through the page
cache from then on; ``direct=False`` (broker.toml ``sink_direct_writes``)
does that from the start.

The price: a reader of the new file reads it from the disk rather than from
memory. For staging that is the commit's copy of small files and consumers
of a freshly committed micro-batch; docs/exactly-once.md discusses it.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from npstream.broker.storage.segment import pwrite_all

__all__ = ["ALIGNMENT", "DirectFileWriter"]

log = logging.getLogger(__name__)

ALIGNMENT = 4096
# Buffers kept for reuse between calls (Stage requests of several tasks run at
# once), and the largest kept: a bigger file gets a buffer of its own.
_KEEP_BUFFERS = 4
_KEEP_MAX_BYTES = 64 << 20
_BUFFER_STEP = 1 << 20


class DirectFileWriter:
    """Creates and patches files with O_DIRECT where it can; thread-safe."""

    def __init__(self, direct: bool = True) -> None:
        self.direct = direct and hasattr(os, "O_DIRECT")
        self._lock = threading.Lock()
        self._buffers: list[mmap.mmap] = []

    def create(self, path: Path, pieces: Sequence[object]) -> int:
        """Write ``pieces`` back to back into the new file ``path`` and fsync it; its size.

        FileExistsError when ``path`` exists. Buffers are anything with the
        buffer protocol.
        """
        views = [memoryview(piece).cast("B") for piece in pieces]  # type: ignore[arg-type]
        size = sum(len(view) for view in views)
        if self.direct:
            try:
                return self._create_direct(path, views, size)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._refused(path, exc)
                path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            pwrite_all(fd, views, 0)  # type: ignore[arg-type]
            os.fsync(fd)
        finally:
            os.close(fd)
        return size

    def patch(self, path: Path, patches: Sequence[tuple[int, object]],
              before_sync: Callable[[], None] | None = None) -> None:
        """Overwrite ranges of the existing file ``path``, then fdatasync it.

        ``patches`` are (position, bytes) inside the file (ValueError past its
        end). With O_DIRECT the blocks around each range are read, patched and
        written back whole, so the file stays out of the page cache; its size
        does not change. ``before_sync`` runs between the writes and the sync.
        """
        views = [(position, memoryview(data).cast("B"))  # type: ignore[arg-type]
                 for position, data in patches]
        fd = -1
        if self.direct:
            try:
                fd = os.open(path, os.O_RDWR | os.O_DIRECT)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._refused(path, exc)
        direct = fd >= 0
        if not direct:
            fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            for position, view in views:
                if position < 0 or position + len(view) > size:
                    raise ValueError(f"patch of {len(view)} bytes at {position} is outside "
                                     f"{path} ({size} bytes)")
            if direct:
                self._patch_direct(fd, views, size)
            else:
                for position, view in views:
                    pwrite_all(fd, [view], position)
            if before_sync is not None:
                before_sync()
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def _refused(self, path: Path, exc: OSError) -> None:
        self.direct = False
        log.info("%s refuses O_DIRECT (%s): staging files go through the page cache "
                 "from now on", path.parent, exc)

    def _create_direct(self, path: Path, views: list[memoryview], size: int) -> int:
        padded = -(-size // ALIGNMENT) * ALIGNMENT
        buffer = self._take(padded)
        try:
            position = 0
            for view in views:
                buffer[position:position + len(view)] = view
                position += len(view)
            buffer[size:padded] = bytes(padded - size)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
            try:
                with memoryview(buffer) as data:
                    _pwrite_whole(fd, data[:padded], 0)
                if padded != size:
                    os.ftruncate(fd, size)
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            self._give_back(buffer)
        return size

    def _patch_direct(self, fd: int, views: list[tuple[int, memoryview]], size: int) -> None:
        """Read-modify-write of the aligned blocks around the patches (merged where they touch)."""
        spans: list[tuple[int, int, list[tuple[int, memoryview]]]] = []
        for position, view in sorted(views, key=lambda item: item[0]):
            start = position // ALIGNMENT * ALIGNMENT
            end = -(-(position + len(view)) // ALIGNMENT) * ALIGNMENT
            if spans and start <= spans[-1][1]:
                first, last, members = spans[-1]
                spans[-1] = (first, max(last, end), [*members, (position, view)])
            else:
                spans.append((start, end, [(position, view)]))
        for start, end, members in spans:
            length = end - start
            buffer = self._take(length)
            try:
                with memoryview(buffer) as data:
                    # Only blocks a patch covers in part are read: a patch's first and last.
                    edges = {block for position, view in members
                             for block in (position // ALIGNMENT,
                                           (position + len(view) - 1) // ALIGNMENT)}
                    for block in sorted(edges):
                        at = block * ALIGNMENT - start
                        got = os.preadv(fd, [data[at:at + ALIGNMENT]], block * ALIGNMENT)
                        data[at + got:at + ALIGNMENT] = bytes(ALIGNMENT - got)  # past the end
                    for position, view in members:
                        data[position - start:position - start + len(view)] = view
                    _pwrite_whole(fd, data[:length], start)
            finally:
                self._give_back(buffer)
        if spans and spans[-1][1] > size:
            os.ftruncate(fd, size)  # the last block went back whole

    def _take(self, size: int) -> mmap.mmap:
        """A page-aligned buffer of at least ``size`` bytes (anonymous maps are page aligned)."""
        with self._lock:
            fitting = [b for b in self._buffers if len(b) >= size]
            if fitting:
                buffer = min(fitting, key=len)
                self._buffers.remove(buffer)
                return buffer
        return mmap.mmap(-1, max(_BUFFER_STEP, -(-size // _BUFFER_STEP) * _BUFFER_STEP))

    def _give_back(self, buffer: mmap.mmap) -> None:
        with self._lock:
            if len(buffer) <= _KEEP_MAX_BYTES:
                self._buffers.append(buffer)
                self._buffers.sort(key=len, reverse=True)
                if len(self._buffers) <= _KEEP_BUFFERS:
                    return
                buffer = self._buffers.pop()  # the smallest goes
        buffer.close()


def _pwrite_whole(fd: int, data: memoryview, position: int) -> None:
    written = 0
    while written < len(data):
        count = os.pwrite(fd, data[written:], position + written)
        if count <= 0:
            raise OSError(errno.EIO, f"pwrite wrote nothing at byte {position + written}")
        written += count

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

A later patch of a direct file must read the blocks at the ends of each
patched range from the disk (O_DIRECT writes whole blocks). ``create_keeping``
hands back copies of chosen blocks as written, which ``patch`` then uses
instead of reading them: under load those reads would be most of a sink
commit's stamping.

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
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from npstream.broker.storage.segment import pwrite_all
from npstream.broker.storage.tuning import (
    BUFFER_STEP,
    KEEP_BLOCKS_MAX_BYTES,
    KEEP_BUFFERS,
    KEEP_MAX_BYTES,
)

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer  # bytes, memoryview, mmap, pyarrow.Buffer...

__all__ = ["ALIGNMENT", "CreatedFile", "DirectFileWriter", "WrittenBlocks", "edge_blocks"]

log = logging.getLogger(__name__)

ALIGNMENT = 4096


def edge_blocks(ranges: Collection[tuple[int, int]]) -> set[int]:
    """The first and last ALIGNMENT block of each (position, length) range: what a patch reads."""
    return {block for position, length in ranges if length > 0
            for block in (position // ALIGNMENT, (position + length - 1) // ALIGNMENT)}


@dataclass(frozen=True)
class CreatedFile:
    """A file ``create_keeping`` wrote: its size and identity, and the blocks it kept."""

    size: int
    inode: int
    mtime_ns: int
    blocks: dict[int, bytes] = field(default_factory=dict)  # empty unless written directly


class WrittenBlocks:
    """Blocks of created files by path, handed out only while the file is unchanged.

    A file's entry is returned only when the file now at that path has the
    inode, size and mtime it had when created; any write since (a patch, a
    replacement under the same name) changes one of them. Thread-safe; the
    oldest entries are forgotten beyond ``max_bytes``.
    """

    def __init__(self, max_bytes: int = KEEP_BLOCKS_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._files: OrderedDict[str, CreatedFile] = OrderedDict()
        self._bytes = 0

    def remember(self, path: Path, created: CreatedFile) -> None:
        if not created.blocks:
            return
        with self._lock:
            self._forget_locked(str(path))
            self._files[str(path)] = created
            self._bytes += len(created.blocks) * ALIGNMENT
            while self._bytes > self.max_bytes and self._files:
                self._forget_locked(next(iter(self._files)))

    def blocks(self, path: Path) -> dict[int, bytes]:
        """The blocks of the file at ``path`` if it is still the one created; else empty."""
        with self._lock:
            created = self._files.get(str(path))
        if created is None:
            return {}
        try:
            info = os.stat(path)
        except OSError:
            return {}
        if (info.st_ino, info.st_size, info.st_mtime_ns) != (
                created.inode, created.size, created.mtime_ns):
            return {}
        return created.blocks

    def _forget_locked(self, key: str) -> None:
        created = self._files.pop(key, None)
        if created is not None:
            self._bytes -= len(created.blocks) * ALIGNMENT


class DirectFileWriter:
    """Creates and patches files with O_DIRECT where it can; thread-safe."""

    def __init__(self, direct: bool = True) -> None:
        self.direct = direct and hasattr(os, "O_DIRECT")
        self._lock = threading.Lock()
        self._buffers: list[mmap.mmap] = []

    def create(self, path: Path, pieces: Sequence[ReadableBuffer]) -> int:
        """Write ``pieces`` back to back into the new file ``path`` and fsync it; its size.

        FileExistsError when ``path`` exists. Buffers are anything with the
        buffer protocol.
        """
        return self.create_keeping(path, pieces, ()).size

    def create_keeping(self, path: Path, pieces: Sequence[ReadableBuffer],
                       keep_blocks: Collection[int]) -> CreatedFile:
        """``create``, also returning copies of the blocks ``keep_blocks`` as written.

        Blocks are kept only when the file was written directly (a buffered
        patch reads nothing); pass them to ``patch`` as ``known_blocks``
        while the file's inode and mtime are still these.
        """
        views = [memoryview(piece).cast("B") for piece in pieces]
        size = sum(len(view) for view in views)
        if self.direct:
            try:
                return self._create_direct(path, views, size, keep_blocks)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._refused(path, exc)
                path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            pwrite_all(fd, views, 0)
            os.fsync(fd)
            return _created(fd, size, {})
        finally:
            os.close(fd)

    def patch(self, path: Path, patches: Sequence[tuple[int, object]],
              before_sync: Callable[[], None] | None = None,
              known_blocks: Mapping[int, bytes] | None = None) -> None:
        """Overwrite ranges of the existing file ``path``, then fdatasync it.

        ``patches`` are (position, bytes) inside the file (ValueError past its
        end). With O_DIRECT the blocks around each range are read, patched and
        written back whole, so the file stays out of the page cache; its size
        does not change. A block in ``known_blocks`` (the file's current bytes
        of it, from ``create_keeping``) is not read. ``before_sync`` runs
        between the writes and the sync.
        """
        # ``data``: any buffer. Stamping passes numpy arrays, whose stubs declare the
        # buffer protocol (ndarray.__buffer__) only for Python >= 3.12.
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
                self._patch_direct(fd, views, size, known_blocks or {})
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

    def _create_direct(self, path: Path, views: list[memoryview], size: int,
                       keep_blocks: Collection[int]) -> CreatedFile:
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
                    pwrite_all(fd, [data[:padded]], 0)
                if padded != size:
                    os.ftruncate(fd, size)
                os.fsync(fd)
                kept = {block: bytes(buffer[block * ALIGNMENT:(block + 1) * ALIGNMENT])
                        for block in keep_blocks if 0 <= block * ALIGNMENT < size}
                return _created(fd, size, kept)
            finally:
                os.close(fd)
        finally:
            self._give_back(buffer)

    def _patch_direct(self, fd: int, views: list[tuple[int, memoryview]], size: int,
                      known_blocks: Mapping[int, bytes]) -> None:
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
                    edges = edge_blocks([(position, len(view)) for position, view in members])
                    for block in sorted(edges):
                        at = block * ALIGNMENT - start
                        known = known_blocks.get(block)
                        if known is not None:
                            data[at:at + ALIGNMENT] = known
                            continue
                        got = os.preadv(fd, [data[at:at + ALIGNMENT]], block * ALIGNMENT)
                        data[at + got:at + ALIGNMENT] = bytes(ALIGNMENT - got)  # past the end
                    for position, view in members:
                        data[position - start:position - start + len(view)] = view
                    pwrite_all(fd, [data[:length]], start)
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
        return mmap.mmap(-1, max(BUFFER_STEP, -(-size // BUFFER_STEP) * BUFFER_STEP))

    def _give_back(self, buffer: mmap.mmap) -> None:
        with self._lock:
            if len(buffer) <= KEEP_MAX_BYTES:
                self._buffers.append(buffer)
                self._buffers.sort(key=len, reverse=True)
                if len(self._buffers) <= KEEP_BUFFERS:
                    return
                buffer = self._buffers.pop()  # the smallest goes
        buffer.close()


def _created(fd: int, size: int, blocks: dict[int, bytes]) -> CreatedFile:
    info = os.fstat(fd)
    return CreatedFile(size=size, inode=info.st_ino, mtime_ns=info.st_mtime_ns, blocks=blocks)

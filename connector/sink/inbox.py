"""Client side of the stage inbox: hand Stage data to a broker on this machine in a file.

Sending a Stage request's Arrow data through gRPC costs more CPU than
everything else the broker does with it (docs/exactly-once.md, "Stage by
file on the broker's machine"). When the broker runs on this kernel and this process sees the
broker's inbox directory (same boot id; the directory's device and inode as
the broker states them), the data is written into a file of this process in
that directory and the request names the file instead of carrying the bytes.

The files are reused from one request to the next, so their pages are
already in memory: writing into fresh page cache costs several times more on
a virtual machine than writing over pages already touched. A file is in one
request at a time, and only a request that was answered at its first attempt
gives its file back for reuse; after anything else the file is deleted rather
than rewritten, so a request the broker may still be reading never sees bytes
change under it. The writer keeps the files of this process for every task
that runs in it (Spark reuses its Python workers), deletes them at exit, and
the broker deletes files nobody wrote to for ten minutes (a killed worker). A
forked child gets a writer and files of its own.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import mmap
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from npstream.errors import InboxUnavailable
from npstream.proto import pb
from npstream.proto.host_identity import boot_id

__all__ = [
    "InboxFile",
    "InboxUnavailable",
    "StageInboxWriter",
    "check_inbox",
    "turn_off",
    "writer_for",
]

log = logging.getLogger(__name__)

# Files grow in steps of this many bytes, so requests of slightly different
# sizes reuse a file without resizing it.
_GROW_STEP = 1 << 20
_FILE_MODE = 0o640


def check_inbox(description: pb.StageInboxResponse) -> Path:
    """The inbox path when this process sees the broker's inbox directory, else InboxUnavailable."""
    if not description.host_id:
        raise InboxUnavailable("the broker offers no stage inbox")
    if description.host_id != boot_id():
        raise InboxUnavailable("the broker runs on another machine")
    path = Path(description.path)
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InboxUnavailable(f"cannot see the broker's inbox {path}: {exc.strerror}") from None
    if (info.st_dev, info.st_ino) != (description.device, description.inode):
        raise InboxUnavailable(f"{path} here is not the broker's inbox (device/inode differ)")
    return path


@dataclass
class InboxFile:
    """One reusable file: its name in the inbox, descriptor, inode and writable map."""

    name: str
    fd: int
    inode: int
    map: mmap.mmap | None = None

    @property
    def capacity(self) -> int:
        return len(self.map) if self.map is not None else 0

    def close(self, directory: Path) -> None:
        _unmap(self)
        os.close(self.fd)
        with contextlib.suppress(FileNotFoundError):  # swept by the broker
            os.unlink(directory / self.name)


class StageInboxWriter:
    """The inbox files of this process for one broker inbox; thread-safe."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # A forked child inherits this object and its files but must neither write
        # them (its parent does) nor delete them at its exit: writer_for gives it its own.
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._free: list[InboxFile] = []
        self._closed = False
        atexit.register(self.close)

    def write(self, table: pa.Table) -> tuple[InboxFile, int]:
        """A file holding ``table`` as an Arrow IPC stream in its first ``length`` bytes.

        The caller sends the request, then gives the file back with
        ``release(file, reusable)``. InboxUnavailable when no file can be
        written (a full filesystem, no permission).
        """
        length = _ipc_size(table)
        file = self._take()
        try:
            if file.capacity < length:
                _grow(file, length)
            assert file.map is not None
            with pa.ipc.new_stream(pa.FixedSizeBufferWriter(pa.py_buffer(file.map)),
                                   table.schema) as writer:
                writer.write_table(table)
            os.utime(file.fd)  # writes through a map may leave mtime alone; the sweep reads it
        except OSError as exc:
            self.release(file, reusable=False)
            raise InboxUnavailable(f"cannot write into {self.directory}: {exc}") from None
        except BaseException:
            self.release(file, reusable=False)
            raise
        return file, length

    def release(self, file: InboxFile, reusable: bool) -> None:
        """Give a file back after its request; not reusable: delete it instead."""
        with self._lock:
            if reusable and not self._closed:
                self._free.append(file)
                return
        file.close(self.directory)

    def close(self) -> None:
        """Delete every idle file (at exit; files in a request are deleted on release)."""
        if os.getpid() != self.pid:
            return  # inherited through fork: the files are the parent's
        with self._lock:
            self._closed = True
            files, self._free = self._free, []
        for file in files:
            file.close(self.directory)

    def _take(self) -> InboxFile:
        with self._lock:
            while self._free:
                file = self._free.pop()
                if os.fstat(file.fd).st_nlink:
                    return file
                file.close(self.directory)  # the broker swept it while idle
        return self._create()

    def _create(self) -> InboxFile:
        host = "".join(ch for ch in boot_id()[:8] if ch.isalnum()) or "host"  # $NPSTREAM_HOST_ID
        name = f"{host}-{os.getpid()}-{uuid.uuid4().hex[:12]}.arrow"
        try:
            fd = os.open(self.directory / name,
                         os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE)
        except OSError as exc:
            raise InboxUnavailable(
                f"cannot create a file in {self.directory}: {exc.strerror}") from None
        return InboxFile(name=name, fd=fd, inode=os.fstat(fd).st_ino)


def _ipc_size(table: pa.Table) -> int:
    """Bytes of ``table`` as an IPC stream, counted without writing them."""
    counter = pa.MockOutputStream()
    with pa.ipc.new_stream(counter, table.schema) as writer:
        writer.write_table(table)
    return int(counter.size())


def _grow(file: InboxFile, length: int) -> None:
    """Reserve room for ``length`` bytes and map it.

    The blocks are allocated up front (posix_fallocate): writing through a
    map into a hole of a full filesystem would kill the process with SIGBUS
    instead of raising ENOSPC here.
    """
    size = -(-length // _GROW_STEP) * _GROW_STEP
    _unmap(file)
    os.posix_fallocate(file.fd, 0, size)
    file.map = mmap.mmap(file.fd, size)


# One writer per broker address for the whole process: tasks that run one
# after the other in a reused Spark Python worker share its warm files. None:
# this process stages over gRPC with that broker. Keyed by pid too, so that a
# forked child never writes into its parent's files.
_writers: dict[tuple[int, str], StageInboxWriter | None] = {}
_writers_lock = threading.Lock()


def writer_for(address: str,
               describe: Callable[[], pb.StageInboxResponse]) -> StageInboxWriter | None:
    """This process's writer for the broker at ``address``; None when it cannot stage by file.

    ``describe`` asks the broker for its inbox (the StageInbox RPC), once per
    process and address; it raises InboxUnavailable when the broker has none.
    """
    key = (os.getpid(), address)
    with _writers_lock:
        if key in _writers:
            return _writers[key]
    try:
        writer: StageInboxWriter | None = StageInboxWriter(check_inbox(describe()))
    except InboxUnavailable as exc:
        log.info("Stage requests to %s carry their data over gRPC: %s", address, exc)
        writer = None
    with _writers_lock:
        return _writers.setdefault(key, writer)


def turn_off(address: str, reason: str) -> None:
    """Stage over gRPC with ``address`` from now on (its inbox refused a file of ours)."""
    key = (os.getpid(), address)
    with _writers_lock:
        writer = _writers.get(key)
        _writers[key] = None
    if writer is not None:
        writer.close()
        log.warning("Stage requests to %s carry their data over gRPC from now on: %s",
                    address, reason)


def _unmap(file: InboxFile) -> None:
    """Drop the file's map; if an Arrow writer's view of it is still alive, GC unmaps it."""
    if file.map is not None:
        with contextlib.suppress(BufferError):
            file.map.close()
        file.map = None

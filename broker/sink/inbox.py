"""The stage inbox: Stage data handed over in a file by a Spark task on the broker's machine.

A Stage request carries up to stageBytes of Arrow data, and moving those
bytes through gRPC (protobuf framing, HTTP/2, two socket copies, assembling
the message on the broker) cost the sending task 2.4-10.7 ms of CPU per
6.5 MB on the benchmark machine (the high figure when the VM hands out fresh
memory for the buffers), on the two cores Spark keeps busy. A task on the
same kernel can instead write the Arrow IPC stream into a file of its own in
this directory, reused between requests so its pages stay warm, and send
only the file's name, inode and length
(``StageRequest.inbox_file``); the broker reads those bytes and stages them
exactly as if they had come over gRPC, with the same checks.

What the broker trusts of the client: nothing beyond what it could send
over gRPC anyway. It opens only plain names inside its own inbox directory,
never following a symlink and never blocking on a FIFO, checks that the
opened file is a regular file with the inode the client named and holds the
stated length, and copies the bytes into its own memory before decoding them
(a memory map would crash the broker with SIGBUS if the client truncated the
file meanwhile). Anything else is refused with a reason, and the client
sends the same rows over gRPC: a by-reference request never fails a write.

Files are the clients' and normally deleted by them; the sink sweep deletes
files nobody wrote to for ``IDLE_FILE_S`` (a task that was killed). A client
notices that its file was swept (no link left) and creates a new one.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from pathlib import Path

import pyarrow as pa

from npstream.broker.sink.errors import InboxRefused
from npstream.broker.sink.tuning import IDLE_FILE_S
from npstream.proto import pb
from npstream.proto.host_identity import boot_id

__all__ = ["INBOX_DIR_NAME", "InboxRefused", "StageInbox"]

log = logging.getLogger(__name__)

# Under data_dir, beside sink/ (whose subdirectories are sink ids) and streams/.
INBOX_DIR_NAME = "stage-inbox"
# What a client may name: one path component, no leading dot (so never "..").
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class StageInbox:
    """The inbox directory of one broker: described to clients, read on Stage, swept."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root.resolve()
        self.max_bytes = max_bytes
        self._dir_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        info = os.fstat(self._dir_fd)
        self._description = pb.StageInboxResponse(
            host_id=boot_id(), path=str(self.root), device=info.st_dev, inode=info.st_ino)

    def describe(self) -> pb.StageInboxResponse:
        """What a client needs to tell whether it sees this directory."""
        return self._description

    def read(self, name: str, inode: int, length: int) -> pa.Buffer:
        """The first ``length`` bytes of inbox file ``name``, copied into a new Arrow buffer."""
        if not _FILE_NAME.fullmatch(name):
            raise InboxRefused(f"{name!r} is not a file name of the stage inbox")
        if not 0 < length <= self.max_bytes:
            raise InboxRefused(f"inbox_length {length} is not between 1 and "
                               f"{self.max_bytes} bytes (grpc_max_message_bytes)")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=self._dir_fd)
        except OSError as exc:
            raise InboxRefused(f"cannot open {name} in {self.root}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InboxRefused(f"{name} in {self.root} is not a regular file")
            if info.st_ino != inode:
                raise InboxRefused(f"{name} in {self.root} has inode {info.st_ino}, "
                                   f"not {inode}: another file than the client's")
            if info.st_size < length:
                raise InboxRefused(f"{name} in {self.root} holds {info.st_size} bytes, "
                                   f"fewer than inbox_length {length}")
            return _read_exactly(fd, name, length)
        finally:
            os.close(fd)

    def sweep(self, idle_s: float = IDLE_FILE_S) -> int:
        """Delete files nobody wrote to for ``idle_s``; how many were deleted."""
        cutoff = time.time() - idle_s
        deleted = 0
        with os.scandir(self._dir_fd) as entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                    if info.st_mtime < cutoff and not stat.S_ISDIR(info.st_mode):
                        os.unlink(entry.name, dir_fd=self._dir_fd)
                        deleted += 1
                except FileNotFoundError:
                    continue  # its client deleted it meanwhile
        if deleted:
            log.info("stage inbox %s: deleted %d file(s) idle for %.0fs", self.root, deleted,
                     idle_s)
        return deleted

    def close(self) -> None:
        os.close(self._dir_fd)


def _read_exactly(fd: int, name: str, length: int) -> pa.Buffer:
    buffer = pa.allocate_buffer(length)
    view = memoryview(buffer)
    done = 0
    while done < length:
        count = os.preadv(fd, [view[done:]], done)
        if count <= 0:  # the client truncated it since fstat
            raise InboxRefused(f"{name} ended at byte {done} of {length} while being read")
        done += count
    return buffer

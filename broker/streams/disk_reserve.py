"""Room kept back in the data dir so that deleting still works on a full disk.

Every remedy for a full disk writes before it frees: moving a stream's start
writes its start-offset file, deleting all of a stream's messages rolls its
active segment (index files, a new segment file), changing ``max_bytes``
writes the stream's SQLite row and its retention file. With no byte free
each of those would fail with DISK_FULL, so nothing but deleting a whole
stream could free space.

The broker therefore keeps a file of ``RESERVE_BYTES`` in its data dir
(``disk-reserve``, allocated, not sparse). A deletion or config change that
fails because the disk is full deletes that file and runs once more, in the
room it gave back; the next retention pass (or the deletion itself, when it
freed enough) makes the file again once twice its size is free, so it never
takes more than half of what is free. Why a reserve rather than deleting
segments before writing anything: a config change frees nothing by itself,
and deleting all messages of a stream whose messages all sit in its active
segment must create the next segment before it may delete that one.

Anything else (a publish, a stage) may take the released room first; the
remedy then fails with DISK_FULL and the reserve is back once space
is free.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from npstream.broker.errors import is_disk_full
from npstream.broker.log_events import event_fields
from npstream.broker.streams.tuning import RESERVE_BYTES

__all__ = ["RESERVE_FILE", "DiskReserve"]

log = logging.getLogger(__name__)

RESERVE_FILE = "disk-reserve"

T = TypeVar("T")


class DiskReserve:
    """The reserve file of one data dir (module docstring). Thread-safe enough: the
    file system arbitrates, and a lost race only leaves the reserve to the next pass."""

    def __init__(self, data_dir: Path, size: int = RESERVE_BYTES) -> None:
        self.path = data_dir / RESERVE_FILE
        self.size = size
        self._short = False  # the last attempt found too little room (logged once)

    def ensure(self) -> bool:
        """Make the reserve unless it exists; False when less than twice its size is free."""
        try:
            if self.path.stat().st_size >= self.size:
                return True
        except FileNotFoundError:
            pass
        try:
            stats = os.statvfs(self.path.parent)
            if stats.f_bavail * stats.f_frsize < 2 * self.size:
                if not self._short:
                    log.warning("disk reserve: less than %d bytes free in %s; the %d-byte "
                                "reserve that lets deletions run on a full disk is made "
                                "once there is", 2 * self.size, self.path.parent, self.size)
                self._short = True
                return False
            with open(self.path, "wb") as handle:
                os.posix_fallocate(handle.fileno(), 0, self.size)
                os.fsync(handle.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.path.unlink()
            if not self._short:
                log.warning("disk reserve: could not make %s: %s", self.path, exc)
            self._short = True
            return False
        if self._short:
            log.info("disk reserve: %d bytes kept in %s again", self.size, self.path)
        self._short = False
        return True

    def freeing(self, stream: str, action: str, operation: Callable[[], T]) -> T:
        """``operation()``; when it fails for a full disk, release the reserve and run it again.

        ``operation`` must leave nothing half done when it fails (the
        deletions and config changes undo or redo cleanly).
        """
        try:
            return operation()
        except Exception as exc:
            if not is_disk_full(exc) or not self._release(stream, action):
                raise
        result = operation()
        self.ensure()  # it freed space: the reserve comes back if there is room
        return result

    def _release(self, stream: str, action: str) -> bool:
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        log.warning("disk full: released the %d-byte disk reserve so that %s of stream '%s' "
                    "can run", self.size, action, stream, extra=event_fields(stream=stream))
        return True

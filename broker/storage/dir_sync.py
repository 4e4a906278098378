"""Syncs shared by every caller that needs one at the same time: a directory, a filesystem.

Creating a stream makes a directory in ``<data_dir>/streams/``, a retention
file and a segment file in it; all of that, and the first message, is
durable only once the new files, the new directory and its parent are
fsynced: four fsyncs (each a journal commit on ext4, ~1 ms here) per stream.
Streams created at thousands per second (a first publish to each) would
spend all their time there. Instead a new stream's files are made without
fsyncs and its first sync is one ``syncfs`` of the data directory's
filesystem shared by every stream created meanwhile (``sync_filesystem_shared``),
or, where syncfs is not available, the fsyncs with the parent's shared
(``fsync_dir_shared``).

Sharing: a caller waits for a sync that *started after* its change (the one
running when it arrives may have missed it), and whoever finds none running
starts it for everyone waiting: one sync per round, the group commit of
group_commit.py with the sync as its flush. A failed sync fails every caller
of its round (their changes may not be durable), not later rounds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Callable
from pathlib import Path

from npstream.broker.storage.files import fsync_dir
from npstream.broker.storage.group_commit import GroupCommit

__all__ = ["SYNCFS_AVAILABLE", "fsync_dir_shared", "sync_filesystem_shared"]


def _load_syncfs() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_syncfs = _load_syncfs()
SYNCFS_AVAILABLE = _syncfs is not None


def _syncfs_of(directory: Path) -> None:
    """syncfs(2) of the filesystem holding ``directory``: all its data and metadata.

    Linux reports write-back errors of the filesystem since 5.8; an error
    raises OSError like a failed fsync.
    """
    assert _syncfs is not None
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _syncfs(fd) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"syncfs of {directory}: {os.strerror(errno)}")
    finally:
        os.close(fd)


class _SharedSync:
    """One directory's (or filesystem's) shared sync: a group commit whose flush is the sync."""

    def __init__(self, directory: Path, action: Callable[[Path], None]) -> None:
        self.directory = directory
        self._action = action
        self._commit: GroupCommit[None, list[None]] = GroupCommit(
            self._flush, list, list.append)

    def _flush(self, _callers: list[None]) -> None:
        self._action(self.directory)

    def sync(self) -> None:
        """Return after a sync that started after this call (a failed one raises)."""
        self._commit.commit(None)


_syncs: dict[tuple[Path, bool], _SharedSync] = {}
_syncs_lock = threading.Lock()


def _shared(directory: Path, whole_filesystem: bool) -> _SharedSync:
    with _syncs_lock:
        shared = _syncs.get((directory, whole_filesystem))
        if shared is None:
            shared = _syncs[directory, whole_filesystem] = _SharedSync(
                directory, _syncfs_of if whole_filesystem else fsync_dir)
        return shared


def fsync_dir_shared(directory: Path) -> None:
    """fsync ``directory`` so that changes made in it before this call are durable.

    Concurrent callers share fsyncs: at most one runs per directory at a
    time, and each caller returns after one that began after it was called.
    Meant for the few directories many streams share (the streams root).
    """
    _shared(directory, False).sync()


def sync_filesystem_shared(directory: Path) -> None:
    """Make everything written on ``directory``'s filesystem before this call durable.

    One syncfs per round for all concurrent callers (module docstring);
    only where SYNCFS_AVAILABLE.
    """
    _shared(directory, True).sync()

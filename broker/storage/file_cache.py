"""An LRU of open segment file descriptors shared by every stream of a Storage.

Ten thousand streams with a few segments each would need tens of thousands of
descriptors if every log kept its files open; instead every read, write and
fsync borrows a descriptor from this cache, which keeps at most
``max_open_files`` of them open and closes the least recently used idle one
when it needs room. A descriptor in use is never closed under its user: it is
closed when it is returned, so the cap can be exceeded by the number of
concurrent borrowers (bounded in practice by the broker's thread pools).

Descriptors are opened O_RDWR and used only with pread/pwrite, so one
descriptor per file serves any number of threads at once. Closing a
descriptor that has unsynced writes loses nothing: fsync on any later
descriptor of the same file flushes them.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FileCache"]


@dataclass
class _Handle:
    fd: int
    borrowers: int = 0
    evicted: bool = False


class FileCache:
    """Borrow descriptors with ``with cache.borrow(path) as fd:``; thread-safe."""

    def __init__(self, max_open_files: int) -> None:
        self.max_open_files = max_open_files
        self._lock = threading.Lock()
        self._handles: OrderedDict[Path, _Handle] = OrderedDict()
        # Told the duration (seconds) of every data fsync made through this
        # cache's descriptors: the broker's fsync latency histogram. The cache
        # is what every segment of a Storage shares, so one hook covers them.
        self.on_sync: Callable[[float], None] | None = None

    @contextmanager
    def borrow(self, path: Path, *, create: bool = False) -> Iterator[int]:
        """A descriptor for ``path`` (opened read-write; created when ``create``)."""
        handle = self._acquire(path, create)
        try:
            yield handle.fd
        finally:
            with self._lock:
                handle.borrowers -= 1
                if handle.evicted and handle.borrowers == 0:
                    os.close(handle.fd)

    def _acquire(self, path: Path, create: bool) -> _Handle:
        with self._lock:
            handle = self._handles.get(path)
            if handle is not None:
                self._handles.move_to_end(path)
                handle.borrowers += 1
                return handle
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o644)
        with self._lock:
            handle = self._handles.get(path)
            if handle is not None:  # another thread opened it meanwhile
                os.close(fd)
                self._handles.move_to_end(path)
                handle.borrowers += 1
            else:
                handle = _Handle(fd, borrowers=1)  # borrowed before eviction runs
                self._handles[path] = handle
                self._evict_idle_locked()
            return handle

    def _evict_idle_locked(self) -> None:
        """Close least recently used idle descriptors until the cache fits (lock held)."""
        handles = self._handles
        while len(handles) > self.max_open_files:
            # The oldest idle one, usually the very first: no copy of the whole cache
            # per eviction (a stream created per publish evicts on every open).
            victim = next((path for path, handle in handles.items() if not handle.borrowers),
                          None)
            if victim is None:
                return  # every descriptor is in use: exceed the cap until returned
            os.close(handles.pop(victim).fd)

    def forget(self, path: Path) -> None:
        """Drop ``path`` from the cache (it is being deleted or renamed)."""
        with self._lock:
            handle = self._handles.pop(path, None)
            if handle is None:
                return
            if handle.borrowers == 0:
                os.close(handle.fd)
            else:
                handle.evicted = True

    def forget_under(self, directory: Path) -> None:
        """Drop every cached file inside ``directory``."""
        with self._lock:
            paths = [p for p in self._handles if p.parent == directory]
        for path in paths:
            self.forget(path)

    def open_count(self) -> int:
        with self._lock:
            return len(self._handles)

    def close(self) -> None:
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
        for handle in handles:
            if handle.borrowers == 0:
                os.close(handle.fd)
            else:
                handle.evicted = True

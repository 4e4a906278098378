"""The segment store of one stream's log: its files, its append lock, its view and durability.

The part of a StreamLog (log.py) every other part works through, like
Kafka's LocalLog: the segments on disk (``files``, segment_list.py), the
append lock that serialises every change to them, the ``LogView`` readers
use (replaced under ``state`` after each change, which is also the condition
``wait_for_data`` sleeps on), the write and sync sequences, the dedup window,
the config and value schemas, and the closed / failed state.

Concurrency model:

- ``lock`` (the append lock) serialises everything that changes the log: the
  group-commit leader's write, roll, deletion, truncation, retention, config
  changes.
- Readers take no lock: they use the current ``view`` (reader.py).
- fsync runs outside the append lock under ``_sync_lock`` (the group-commit
  leader's, or the flusher's for WRITE-mode data; group_commit.py).
  ``written_seq`` counts written groups; ``synced_seq`` is the last count
  known durable. Rolling a segment fsyncs it first, so syncing the current
  tail covers everything written.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

from npstream.broker.errors import (
    BrokerError,
    DiskFullError,
    DiskIOError,
    ShuttingDownError,
    StreamNotFoundError,
    is_disk_full,
)
from npstream.broker.storage.dedup import DedupWindow, rebuild_window
from npstream.broker.storage.errors import UndoFailedError
from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.loader import LoadedLog
from npstream.broker.storage.reader import LogView
from npstream.broker.storage.results import StoredRow
from npstream.broker.storage.segment_list import SegmentList
from npstream.broker.storage.settings import StorageSettings, StreamConfig
from npstream.broker.storage.staged_segment import StagedSegment
from npstream.broker.storage.stream_files import (
    CleanShutdown,
    read_retention_config,
    write_clean_shutdown,
    write_retention_config,
)
from npstream.broker.storage.value_schemas import ValueSchemas

__all__ = ["SegmentStore"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class SegmentStore:
    """One log's segments, append lock, current view and durability (module docstring).

    Fields without an underscore are shared with the appender, readers and
    truncation of the same log; they change only under ``lock``.
    """

    __slots__ = ("_listeners", "_listeners_lock", "_sync_lock", "cache", "clock", "closed",
                 "config", "dedup", "directory", "failure", "files", "last_timestamp", "lock",
                 "name", "schemas", "settings", "state", "synced_seq", "typed", "view",
                 "written_seq")

    def __init__(
        self,
        name: str,
        config: StreamConfig,
        directory: Path,
        loaded: LoadedLog,
        *,
        settings: StorageSettings,
        cache: FileCache,
        clock: Callable[[], int],
        value_schemas: ValueSchemas,
    ) -> None:
        self.name = name
        self.config = config
        self.schemas = value_schemas
        self.typed = value_schemas.typed  # read on every append: a plain attribute
        self.directory = directory
        self.settings = settings
        self.cache = cache
        self.clock = clock
        self.files = SegmentList(name, directory, loaded.segments, settings=settings,
                                 cache=cache)
        self.last_timestamp = max((s.max_timestamp for s in loaded.segments), default=-1)
        self.lock = threading.RLock()
        self.state = threading.Condition()
        self.view = LogView(loaded.start_offset, loaded.end_offset, tuple(loaded.segments),
                            loaded.segments[-1].size if loaded.segments else 0,
                            schemas=value_schemas)
        self._sync_lock = threading.Lock()
        self._listeners: tuple[Callable[[], None], ...] = ()
        self._listeners_lock = threading.Lock()
        self.written_seq = 0
        self.synced_seq = 0
        self.closed: BrokerError | None = None
        self.failure: OSError | None = None
        self.dedup: DedupWindow | None = None
        if loaded.directory_exists and read_retention_config(directory) != config:
            write_retention_config(directory, config)
        self.reset_dedup()

    # ------------------------------------------------------------------ state checks

    def check_readable(self) -> None:
        if self.closed is not None:
            raise self.closed

    def check_usable(self) -> None:
        """Raise the error a write would get now (closed, or failed after a disk error)."""
        if self.closed is not None:
            raise self.closed
        if self.failure is not None:
            raise DiskIOError(self.name, "an earlier write or fsync", self.failure)

    # ------------------------------------------------------------------ writing

    def write_at_tail(self, first: int, now: int, write: Callable[[], _T]) -> _T:
        """Run ``write`` at the tail (rolling the segment first when due); lock held.

        A write whose undo failed leaves bytes of unknown state in the file,
        so the log refuses writes from then on (``failure``); any other error
        left nothing behind.
        """
        self.files.ensure_active(first, self.config)
        try:
            result = write()
        except UndoFailedError as exc:
            self.fail(exc)
            raise
        self.last_timestamp = now
        return result

    def publish_view(self, start: int | None = None,
                     recent: pa.RecordBatch | StoredRow | None = None) -> None:
        """Make the current segments visible; ``recent``: the rows a write just stored.

        A new ``start`` alone (deletions) keeps the previous view's recent rows
        (they did not change); every other change replaces them. Lock held.
        """
        tail = self.files.tail
        view = LogView(
            self.view.start if start is None else start,
            tail.next_offset if tail is not None else self.view.end,
            tuple(self.files.segments),
            tail.size if tail is not None else 0,
            self.view.recent if start is not None else recent,
            self.schemas,
        )
        with self.state:
            self.view = view
            self.state.notify_all()
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # a listener's bug must not fail the write that called it
                log.exception("stream %s: append listener %r failed", self.name, listener)

    def add_listener(self, listener: Callable[[], None]) -> None:
        with self._listeners_lock:
            self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        with self._listeners_lock:
            self._listeners = tuple(x for x in self._listeners if x != listener)

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """True as soon as the view ends past ``offset`` (woken by appends), False on timeout."""
        with self.state:
            self.state.wait_for(lambda: self.view.end > offset or self.closed is not None,
                                timeout_s)
            return self.view.end > offset

    def can_adopt(self, staged: StagedSegment, min_bytes: int) -> bool:
        """Whether an append should adopt ``staged`` as a segment rather than copy it.

        Adopting renames the file into this stream's directory, which cannot
        cross a filesystem. And every adopted file becomes a segment, so one
        whose payloads are under ``min_bytes`` is copied instead: a low-rate
        writer would otherwise leave thousands of tiny segments.
        """
        if staged.payload_bytes < min_bytes:
            return False
        try:
            return os.stat(staged.path).st_dev == os.stat(self.directory.parent).st_dev
        except FileNotFoundError:
            return False

    # ------------------------------------------------------------------ durability

    def sync_through(self, sequence: int) -> None:
        """Return once every group up to write ``sequence`` is fsynced."""
        with self._sync_lock:
            if self.synced_seq >= sequence:
                return
            target = self.written_seq
            try:
                self.files.sync_tail()
            except OSError as exc:
                self.fail(exc)
                raise DiskIOError(self.name, "fsync of its log", exc) from exc
            self.synced_seq = target

    def needs_sync(self) -> bool:
        return self.synced_seq < self.written_seq

    def flush(self) -> None:
        """fsync everything written so far."""
        self.sync_through(self.written_seq)

    @contextmanager
    def disk_errors(self, action: str) -> Iterator[None]:
        """Report a write that failed as DiskFullError or DiskIOError naming this stream.

        Out of space: the segment list undid the write (all or nothing), so
        nothing of it is stored and the log takes writes again once space is
        freed. Only when even the undo failed is the log failed: a restart
        is needed (docs/broker.md, "Disk full"), which DiskIOError says, as it
        does for any other I/O error (EIO).
        """
        try:
            yield
        except OSError as exc:
            failed = self.failure is not None
            if is_disk_full(exc) and not failed:
                raise DiskFullError(self.name, action, exc) from exc
            if isinstance(exc, FileNotFoundError):  # a staged file gone: not the disk failing
                raise
            if not failed:  # else fail() logged it
                log.error("stream %s: the %s failed with a disk error and was undone: %s",
                          self.name, action, exc)
            raise DiskIOError(self.name, f"the {action}", exc, refusing=failed) from exc

    def fail(self, exc: OSError) -> None:
        """Refuse writes until the log is reopened: the files may not match it any more."""
        if self.failure is None:
            self.failure = exc
            log.error("stream %s: disk error, the log refuses writes until it is reopened: %s",
                      self.name, exc)

    # ------------------------------------------------------------------ config, lifecycle

    def set_value_schemas(self, schemas: ValueSchemas,
                          before_change: Callable[[int, int], None] | None = None) -> None:
        """Make ``schemas`` the stream's value schemas (StreamLog.set_value_schemas)."""
        if schemas.current < self.schemas.current or not all(
                v in schemas.values for v in self.schemas.values):
            raise ValueError(f"stream '{self.name}': value schema versions only get added "
                             f"(have {sorted(self.schemas.values)}, got "
                             f"{sorted(schemas.values)})")
        with self.lock:
            if before_change is not None:
                view = self.view
                before_change(view.start, view.end)
            self.schemas = schemas
            self.typed = schemas.typed
            self.publish_view(start=self.view.start)  # same rows, new schemas

    def update_config(self, config: StreamConfig) -> None:
        with self.lock:
            old, self.config = self.config, config
            if config != old and self.directory.exists():
                write_retention_config(self.directory, config)
            if config.dedup_window_ms != old.dedup_window_ms:
                self.reset_dedup()

    def reset_dedup(self) -> None:
        """Rebuild the dedup window from the files (its window changed, or the log opened)."""
        window_ms = self.config.dedup_window_ms
        self.dedup = (rebuild_window(self.view, self.cache, window_ms, self.clock())
                      if window_ms > 0 else None)

    def close(self, *, dropped: bool = False) -> None:
        """Flush, record a clean shutdown and refuse further use."""
        with self.lock:
            if self.closed is not None:
                return
            tail = self.files.tail
            if not dropped and self.failure is None:
                self.flush()
                if tail is not None:
                    write_clean_shutdown(self.directory, CleanShutdown(
                        tail.base_offset, tail.size, tail.next_offset, tail.max_timestamp))
            self.closed = (StreamNotFoundError(self.name) if dropped
                           else ShuttingDownError(f"stream '{self.name}' is closed"))
            with self.state:
                self.state.notify_all()
        self.cache.forget_under(self.directory)

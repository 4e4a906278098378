"""The state of one stream's log and what every path shares: views, durability, lifecycle.

``LogState`` is the base of StreamLog (log.py). It holds the fields (the
segments, the current ``LogView``, the locks, the write and sync sequences,
the dedup window, the config and value schemas) and the steps the append,
read and deletion paths (log_appends.py, log_reads.py, log_deletion.py) all
use: publishing a new view, fsyncing through a write sequence, failing the
log after a disk error, config and schema changes, close. Kept apart so each
path is a module of one concept; see log.py for the concurrency model.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from npstream.broker.errors import (
    BrokerError,
    DiskFullError,
    DiskIOError,
    ShuttingDownError,
    StreamNotFoundError,
    is_disk_full,
)
from npstream.broker.storage.append_plan import PendingAppend
from npstream.broker.storage.dedup import DedupWindow, rebuild_window
from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.group_commit import CommitQueue
from npstream.broker.storage.loader import LoadedLog
from npstream.broker.storage.reader import LogView
from npstream.broker.storage.results import StoredRow
from npstream.broker.storage.segment_list import SegmentList
from npstream.broker.storage.settings import StorageSettings, StreamConfig
from npstream.broker.storage.small_append import LoneMessage
from npstream.broker.storage.stream_files import (
    CleanShutdown,
    read_retention_config,
    write_clean_shutdown,
    write_retention_config,
)
from npstream.broker.storage.value_schemas import UNTYPED, ValueSchemas

__all__ = ["LogState", "new_id_prefix"]

log = logging.getLogger(__name__)

# Broker-filled message ids are <16 hex digits of the log instance><offset>. Each log
# opened gets the next value of a random 64-bit start, instead of 8 bytes of
# os.urandom per open (~100 us here: a million streams reopened after eviction).
# Two processes collide only if their random starts fall within as many opens.
_ID_PREFIXES = itertools.count(secrets.randbits(64))


def new_id_prefix() -> str:
    """A fresh prefix of broker-filled ids (the module comment above)."""
    return f"{next(_ID_PREFIXES) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


# What the group-commit queue carries: an append's checked rows, or one small
# message on the lean path (small_append.py).
Payload = PendingAppend | LoneMessage


class LogState:
    """The fields and shared steps of a StreamLog (log.py); not used on its own."""

    _queue: CommitQueue[Payload]  # set by StreamLog: its writer is the append path's

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
        on_dirty: Callable[[Any], None] | None = None,
        value_schemas: ValueSchemas = UNTYPED,
    ) -> None:
        self.name = name
        self._schemas = value_schemas
        self._typed = value_schemas.typed  # read on every append: a plain attribute
        self._config = config
        self._directory = directory
        self._cache = cache
        self._clock = clock
        self._on_dirty = on_dirty
        self._segments = SegmentList(name, directory, loaded.segments, settings=settings,
                                     cache=cache)
        self._last_timestamp = max((s.max_timestamp for s in loaded.segments), default=-1)
        self._append_lock = threading.RLock()
        self._state = threading.Condition()
        self._view = LogView(loaded.start_offset, loaded.end_offset, tuple(loaded.segments),
                             loaded.segments[-1].size if loaded.segments else 0,
                             schemas=value_schemas)
        self._sync_lock = threading.Lock()
        self._listeners: tuple[Callable[[], None], ...] = ()
        self._listeners_lock = threading.Lock()
        self._written_seq = 0
        self._synced_seq = 0
        self._id_prefix_text = new_id_prefix()
        self._id_prefix = self._id_prefix_text.encode()
        self._closed: BrokerError | None = None
        self._failure: OSError | None = None
        self._first_timestamp: tuple[int, int] = (-1, 0)  # (start offset, its timestamp)
        self._dedup: DedupWindow | None = None
        if loaded.directory_exists and read_retention_config(directory) != config:
            write_retention_config(directory, config)
        self._reset_dedup_locked()

    # ------------------------------------------------------------------ properties

    @property
    def config(self) -> StreamConfig:
        return self._config

    @property
    def start_offset(self) -> int:
        return self._view.start

    @property
    def value_schemas(self) -> ValueSchemas:
        """The stream's value schemas (UNTYPED for an untyped stream)."""
        return self._schemas

    @property
    def end_offset(self) -> int:
        return self._view.end

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def failed(self) -> bool:
        """True after a disk error (a failed fsync or undo): writes are refused until the
        log is reopened, and bytes of the failed write may be in the files."""
        return self._failure is not None

    def check_writable(self) -> None:
        """Raise the error a write would get now (closed, or failed after a disk error)."""
        self._check_usable()

    # ------------------------------------------------------------------ durability

    def _sync_through(self, sequence: int) -> None:
        """Return once every group up to write ``sequence`` is fsynced."""
        with self._sync_lock:
            if self._synced_seq >= sequence:
                return
            target = self._written_seq
            try:
                self._segments.sync_tail()
            except OSError as exc:
                self._fail(exc)
                raise DiskIOError(self.name, "fsync of its log", exc) from exc
            self._synced_seq = target

    def needs_sync(self) -> bool:
        return self._synced_seq < self._written_seq

    def flush(self) -> None:
        """fsync everything written so far."""
        self._sync_through(self._written_seq)

    @contextmanager
    def _disk_full_as_error(self, action: str) -> Iterator[None]:
        """Report a write that failed as DiskFullError or DiskIOError naming this stream.

        Out of space: the segment list undid the write (all or nothing), so
        nothing of it is stored and the log takes writes again once space is
        freed. Only when even the undo failed is the log ``failed``: a restart
        is needed (docs/broker.md, "Disk full"), which DiskIOError says, as it
        does for any other I/O error (EIO).
        """
        try:
            yield
        except OSError as exc:
            if is_disk_full(exc) and not self.failed:
                raise DiskFullError(self.name, action, exc) from exc
            if isinstance(exc, FileNotFoundError):  # a staged file gone: not the disk failing
                raise
            if not self.failed:  # else _fail logged it
                log.error("stream %s: the %s failed with a disk error and was undone: %s",
                          self.name, action, exc)
            raise DiskIOError(self.name, f"the {action}", exc, refusing=self.failed) from exc

    def _fail(self, exc: OSError) -> None:
        if self._failure is None:
            self._failure = exc
            log.error("stream %s: disk error, the log refuses writes until it is reopened: %s",
                      self.name, exc)

    def set_value_schemas(self, schemas: ValueSchemas,
                          before_change: Callable[[int, int], None] | None = None) -> None:
        """Make ``schemas`` the stream's value schemas (the registry's, with every version).

        ``before_change(start_offset, end_offset)`` runs under the append
        lock first: no append is written between it and the change, so the
        registry can refuse (raise) or record the change there, e.g. make an
        untyped stream typed only while it holds no messages. Appends checked
        against the previous version are written in it (reads convert them);
        untyped ones queued before the stream became typed fail.
        """
        if schemas.current < self._schemas.current or not all(
                v in schemas.values for v in self._schemas.values):
            raise ValueError(f"stream '{self.name}': value schema versions only get added "
                             f"(have {sorted(self._schemas.values)}, got "
                             f"{sorted(schemas.values)})")
        with self._append_lock:
            if before_change is not None:
                view = self._view
                before_change(view.start, view.end)
            self._schemas = schemas
            self._typed = schemas.typed
            self._publish_view_locked(start=self._view.start)  # same rows, new schemas

    def update_config(self, config: StreamConfig) -> None:
        with self._append_lock:
            old, self._config = self._config, config
            if config != old and self._directory.exists():
                write_retention_config(self._directory, config)
            if config.dedup_window_ms != old.dedup_window_ms:
                self._reset_dedup_locked()

    def _reset_dedup_locked(self) -> None:
        window_ms = self._config.dedup_window_ms
        self._dedup = (rebuild_window(self._view, self._cache, window_ms, self._clock())
                       if window_ms > 0 else None)

    # ------------------------------------------------------------------ lifecycle

    def close(self, *, dropped: bool = False) -> None:
        """Flush, record a clean shutdown and refuse further use."""
        with self._append_lock:
            if self._closed is not None:
                return
            tail = self._segments.tail
            if not dropped and self._failure is None:
                self.flush()
                if tail is not None:
                    write_clean_shutdown(self._directory, CleanShutdown(
                        tail.base_offset, tail.size, tail.next_offset, tail.max_timestamp))
            self._closed = (StreamNotFoundError(self.name) if dropped
                            else ShuttingDownError(f"stream '{self.name}' is closed"))
            with self._state:
                self._state.notify_all()
        self._cache.forget_under(self._directory)

    def _publish_view_locked(self, start: int | None = None,
                             recent: pa.RecordBatch | StoredRow | None = None) -> None:
        """Make the current segments visible; ``recent``: the rows a write just stored.

        A new ``start`` alone (deletions) keeps the previous view's recent rows
        (they did not change); every other change replaces them.
        """
        tail = self._segments.tail
        view = LogView(
            self._view.start if start is None else start,
            tail.next_offset if tail is not None else self._view.end,
            tuple(self._segments.segments),
            tail.size if tail is not None else 0,
            self._view.recent if start is not None else recent,
            self._schemas,
        )
        with self._state:
            self._view = view
            self._state.notify_all()
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # a listener's bug must not fail the write that called it
                log.exception("stream %s: append listener %r failed", self.name, listener)

    def _check_readable(self) -> None:
        if self._closed is not None:
            raise self._closed

    def _check_usable(self) -> None:
        if self._closed is not None:
            raise self._closed
        if self._failure is not None:
            raise DiskIOError(self.name, "an earlier write or fsync", self._failure)


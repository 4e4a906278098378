"""Storage: every stream log under one data directory, the shared file cache and the flusher.

Opening a log is the recovery step (loader.py). The logs used last stay open
(``max_open_logs``, open_logs.py); the others are freed once nothing uses
them and opened again on their next use, so a stream that is not in use costs
nothing but a directory, and retention still covers it (retention.py), a
slice of the directories per pass. Operations on different streams never wait
for each other except on short locks; operations on one name are serialised
by a name lock (one of a fixed set, picked by the name's hash) so open, close,
drop, repair and idle retention do not race.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from npstream.broker.errors import (
    BrokerError,
    InvalidArgumentError,
    ShuttingDownError,
)
from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.files import fsync_dir, stream_dir, streams_root
from npstream.broker.storage.first_frame import lone_first_frame, write_first_segment
from npstream.broker.storage.flusher import Flusher
from npstream.broker.storage.loader import load_log, repair_log
from npstream.broker.storage.log import StreamLog
from npstream.broker.storage.open_logs import OpenLogs
from npstream.broker.storage.peek import peek_stats
from npstream.broker.storage.results import LogStats
from npstream.broker.storage.retention import idle_stream_check
from npstream.broker.storage.segment_store import SegmentStore
from npstream.broker.storage.settings import StorageSettings, StreamConfig
from npstream.broker.storage.stream_files import read_retention_config, write_start_offset
from npstream.broker.storage.tuning import IDLE_RETENTION_BATCH, NAME_LOCKS
from npstream.broker.storage.value_schemas import UNTYPED, ValueSchemas
from npstream.proto.names import STREAM_NAME_RE

__all__ = ["StatsKeeper", "Storage", "wall_clock_ms"]

log = logging.getLogger(__name__)



def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class StatsKeeper(Protocol):
    """Where the stats of streams with no live log are kept for listings (the registry's
    npstream.broker.streams.listing_stats); the storage keeps them right (``drop`` under
    the name lock before anything changes a stream's files)."""

    def get(self, name: str) -> LogStats | None: ...
    def put(self, name: str, stats: LogStats) -> None: ...
    def drop(self, name: str) -> None: ...


class _NoKeeper:
    def get(self, name: str) -> LogStats | None:
        return None

    def put(self, name: str, stats: LogStats) -> None:
        pass

    def drop(self, name: str) -> None:
        pass


class Storage:
    """The storage engine (docs/internals.md "Storage engine"). Thread-safe.

    ``clock`` returns epoch milliseconds (injectable for exact retention and
    dedup tests). Tests simulate disk errors through npstream.broker.faults
    (points ``storage.write`` and ``storage.fsync``).
    """

    def __init__(
        self,
        settings: StorageSettings,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._cache = FileCache(settings.max_open_files)
        self._lock = threading.Lock()
        self._logs = OpenLogs(settings.max_open_logs)
        # Re-entrant, since two names may share one.
        self._name_locks = [threading.RLock() for _ in range(NAME_LOCKS)]
        self._idle_due: dict[str, int] = {}
        self._idle_sweep: Iterator[os.DirEntry[str]] | None = None
        self._closed = False
        self._schemas_of: Callable[[str], ValueSchemas] = lambda _name: UNTYPED
        self._retention_tasks: list[Callable[[int], None]] = []
        self._kept: StatsKeeper = _NoKeeper()
        streams_root(settings.data_dir).mkdir(parents=True, exist_ok=True)
        self._flusher = Flusher(settings.flush_interval_ms)

    # ------------------------------------------------------------------ helpers

    def _directory(self, name: str) -> Path:
        try:
            return stream_dir(self.settings.data_dir, name)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None

    def _name_lock(self, name: str) -> threading.RLock:
        if self._closed:
            raise ShuttingDownError("storage is closed")
        return self._name_locks[hash(name) % NAME_LOCKS]

    def _open_unlocked(self, name: str, config: StreamConfig,
                       value_schemas: ValueSchemas = UNTYPED) -> StreamLog:
        """Open (recover) ``name``; the caller holds its name lock and it is not open."""
        directory = stream_dir(self.settings.data_dir, name)
        self._kept.drop(name)  # its files may change from now on
        loaded = load_log(directory, self._cache, self.settings.index_interval_bytes, name)
        store = SegmentStore(name, config, directory, loaded, settings=self.settings,
                             cache=self._cache, clock=self._clock, value_schemas=value_schemas)
        stream_log = StreamLog(store, on_dirty=self._flusher.mark_dirty)
        self._logs.add(name, stream_log)
        with self._lock:
            self._idle_due.pop(name, None)
        return stream_log

    # ------------------------------------------------------------------ contract

    def set_stats_keeper(self, keeper: StatsKeeper) -> None:
        """Keep the stats peek_stats reads of streams with no live log in ``keeper``."""
        self._kept = keeper

    def set_value_schema_lookup(self, lookup: Callable[[str], ValueSchemas]) -> None:
        """Where a stream's value schemas come from when storage opens it by itself.

        Retention opens idle streams nobody asked for; their frames must
        decode in their versions too (the dedup window is rebuilt on open).
        The broker's registry sets this; the default knows no typed stream.
        """
        self._schemas_of = lookup

    def open_log(self, name: str, config: StreamConfig,
                 value_schemas: ValueSchemas = UNTYPED) -> StreamLog:
        """The open log of ``name``; recovers it first if it was not open.

        ``value_schemas``: a typed stream's schemas, every version (the
        registry's; value_schemas.py). Mid-log corruption raises
        CorruptRecordError and the stream stays closed.
        """
        self._directory(name)
        existing = self._logs.get(name)
        if (existing is not None and existing.config == config
                and existing.value_schemas.values.keys() == value_schemas.values.keys()):
            return existing  # the usual case: no lock
        with self._name_lock(name):
            existing = self._logs.get(name)
            if existing is None:
                return self._open_unlocked(name, config, value_schemas)
            if existing.config != config:
                existing.update_config(config)
            if existing.value_schemas.values.keys() != value_schemas.values.keys():
                existing.set_value_schemas(value_schemas)
            return existing

    def first_frame(self, value: bytes) -> tuple[bytes, int]:
        """(frame, timestamp) of a lone message as offset 0 of a new log (first_frame.py)."""
        now = self._clock()
        return lone_first_frame(value, now), now

    def write_first_frame(self, name: str, config: StreamConfig, frame: bytes) -> None:
        """Write a stream's kept first frame out as its log, durably, before it is opened.

        The nursery's stream (npstream.broker.streams.nursery) becomes an
        ordinary log directory; idempotent across crashes (first_frame.py).
        """
        directory = self._directory(name)
        with self._name_lock(name):
            if name in self._logs:
                raise RuntimeError(f"stream {name}: written out while its log is open")
            self._kept.drop(name)
            write_first_segment(directory, frame, config)

    def add_retention_task(self, task: Callable[[int], None]) -> None:
        """Run ``task(now_ms)`` at every retention pass (the registry's nursery expiry)."""
        self._retention_tasks.append(task)

    def peek_stats(self, name: str) -> LogStats | None:
        """``name``'s stats without opening its log when it is not open; None: only
        opening it can tell.

        Kept stats first (the keeper's row: no file read), else read from its files
        (peek.py) and kept for the next listing.
        """
        live = self._logs.get(name)
        if live is not None:
            return live.stats()
        kept = self._kept.get(name)
        if kept is not None:
            return kept
        directory = self._directory(name)
        with self._name_lock(name):
            live = self._logs.get(name)
            if live is not None:
                return live.stats()
            peeked = peek_stats(directory)
            if peeked is not None:
                self._kept.put(name, peeked)
            return peeked

    def logs_full(self) -> bool:
        """The LRU of open logs holds ``max_open_logs``: a newly opened log evicts one."""
        return self._logs.held_count() >= self._logs.max_open_logs

    def live_log(self, name: str) -> StreamLog | None:
        """``name``'s log when one is alive (marked just used: the LRU keeps it), else None."""
        return self._logs.get(name)

    def live_logs(self) -> list[StreamLog]:
        """Every log alive now (open_logs.py)."""
        return self._logs.live()

    def close_log(self, name: str) -> None:
        """Flush and close ``name`` if it is open (its files stay)."""
        with self._name_lock(name):
            stream_log = self._logs.pop(name)
            if stream_log is not None:
                stream_log.close()

    def drop_log(self, name: str) -> None:
        """Close ``name`` and delete all its files."""
        directory = self._directory(name)
        with self._name_lock(name):
            self._kept.drop(name)
            stream_log = self._logs.pop(name)
            with self._lock:
                self._idle_due.pop(name, None)
            if stream_log is not None:
                stream_log.close(dropped=True)
            self._cache.forget_under(directory)
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(directory)
                fsync_dir(streams_root(self.settings.data_dir))
        log.info("stream %s: dropped, files deleted", name)

    def has_directory(self, name: str) -> bool:
        """Whether ``name``'s directory exists (a nursery stream has none yet)."""
        return self._directory(name).is_dir()

    def restart_missing_log(self, name: str, offset: int, config: StreamConfig,
                            value_schemas: ValueSchemas = UNTYPED) -> None:
        """Give ``name``, whose directory is missing, an empty log starting at ``offset``.

        Repair of a stream whose directory was removed: its offsets below
        ``offset`` were handed out before and must never be again, so the new
        directory starts with a start-offset pointer there (files.py).
        """
        directory = self._directory(name)
        with self._name_lock(name):
            stream_log = self._logs.pop(name)
            if stream_log is not None:
                stream_log.close(dropped=True)
            directory.mkdir(parents=True, exist_ok=True)
            write_start_offset(directory, offset)
            fsync_dir(directory)
            fsync_dir(streams_root(self.settings.data_dir))
            self._open_unlocked(name, config, value_schemas)

    def repair_log(self, name: str, config: StreamConfig,
                   value_schemas: ValueSchemas = UNTYPED) -> tuple[int, str]:
        """Truncate ``name`` at its first bad frame; (truncated_bytes, "file@position").

        The log is closed for the repair and open again afterwards.
        """
        directory = self._directory(name)
        with self._name_lock(name):
            self._kept.drop(name)
            stream_log = self._logs.pop(name)
            if stream_log is not None:
                stream_log.close()
            result = repair_log(directory, self._cache,
                                self.settings.index_interval_bytes, name)
            self._open_unlocked(name, config, value_schemas)
        return result

    def enforce_retention(self) -> None:
        """One retention pass over every stream: open logs, then streams not open."""
        now = self._clock()
        for task in self._retention_tasks:
            try:
                task(now)
            except (OSError, BrokerError) as exc:
                log.error("retention task %r failed: %s", task, exc)
        for stream_log in self._logs.live():
            try:
                stream_log.apply_retention(now)
            except (OSError, BrokerError) as exc:
                log.error("stream %s: retention failed: %s", stream_log.name, exc)
        self._enforce_idle_retention(now)

    def _idle_names(self) -> Iterator[str]:
        """The next stream directory names of the sweep, at most IDLE_RETENTION_BATCH.

        One directory listing is read across passes (os.scandir keeps its place),
        so a pass costs the same with ten streams or a million; a new listing
        starts once the previous one is exhausted.
        """
        if self._idle_sweep is None:
            try:
                self._idle_sweep = os.scandir(streams_root(self.settings.data_dir))
            except FileNotFoundError:
                return
        sweep = self._idle_sweep
        for _ in range(IDLE_RETENTION_BATCH):
            entry = next(sweep, None)
            if entry is None:
                self._idle_sweep = None
                sweep.close()  # type: ignore[attr-defined]  # a ScandirIterator
                return
            yield entry.name

    def _enforce_idle_retention(self, now: int) -> None:
        for name in self._idle_names():
            if self._closed or name in self._logs:
                continue
            with self._lock:
                if self._idle_due.get(name, 0) > now:
                    continue
            if not STREAM_NAME_RE.fullmatch(name):
                continue
            directory = stream_dir(self.settings.data_dir, name)
            config = read_retention_config(directory)
            if config is None:
                continue
            try:
                with self._name_lock(name):
                    if name in self._logs:
                        continue
                    check = idle_stream_check(directory, config, now)
                    if check.must_open:
                        stream_log = self._open_unlocked(name, config, self._schemas_of(name))
                        stream_log.apply_retention(now)
                        self._logs.pop(name)
                        stream_log.close()
                        check = idle_stream_check(directory, config, now)
                    if self._kept.get(name) is None:  # the next listing reads no files
                        peeked = peek_stats(directory)
                        if peeked is not None:
                            self._kept.put(name, peeked)
                    with self._lock:
                        self._idle_due[name] = max(check.next_due_ms, now + 1)
            except (OSError, BrokerError) as exc:
                log.error("stream %s: retention of the idle stream failed: %s", name, exc)
                with self._lock:
                    self._idle_due[name] = now + self.settings.retention_check_interval_ms * 60

    def set_sync_observer(self, observe: Callable[[float], None] | None) -> None:
        """Call ``observe(seconds)`` after every fsync of message data (the metrics' hook)."""
        self._cache.on_sync = observe

    def open_files(self) -> int:
        """Message-data file descriptors open now (at most ``max_open_files`` when idle)."""
        return self._cache.open_count()

    def open_streams(self) -> list[str]:
        """Names of the logs open now."""
        return sorted(stream_log.name for stream_log in self._logs.live())

    def close(self) -> None:
        """Flush, fsync and close every log; the storage cannot be used afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sweep, self._idle_sweep = self._idle_sweep, None
        if sweep is not None:
            sweep.close()  # type: ignore[attr-defined]
        logs = self._logs.clear()
        self._flusher.close()
        for stream_log in logs:
            try:
                stream_log.close()
            except (OSError, BrokerError) as exc:
                log.error("stream %s: close failed: %s", stream_log.name, exc)
        self._cache.close()

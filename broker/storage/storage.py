"""Storage: every stream log under one data directory, the shared file cache and the flusher.

Opening a log is the recovery step (loader.py). Logs stay open until
close_log/drop_log/close; streams that were never opened since the broker
started cost nothing but a directory, and retention still covers them
(retention.py). Operations on different streams never wait for each other
except on the short registry lock; operations on one name are serialised by
a per-name lock so open, close, drop, repair and idle retention do not race.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from npstream.broker.errors import (
    BrokerError,
    InvalidArgumentError,
    ShuttingDownError,
)
from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.files import fsync_dir, stream_dir, streams_root
from npstream.broker.storage.flusher import Flusher
from npstream.broker.storage.loader import load_log, repair_log
from npstream.broker.storage.log import StreamLog
from npstream.broker.storage.retention import idle_stream_check
from npstream.broker.storage.settings import StorageSettings, StreamConfig
from npstream.broker.storage.stream_files import read_retention_config
from npstream.broker.storage.value_schemas import UNTYPED, ValueSchemas
from npstream.proto.names import STREAM_NAME_RE

__all__ = ["Storage", "wall_clock_ms"]

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


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
        self._logs: dict[str, StreamLog] = {}
        self._name_locks: dict[str, threading.Lock] = {}
        self._idle_due: dict[str, int] = {}
        self._closed = False
        self._schemas_of: Callable[[str], ValueSchemas] = lambda _name: UNTYPED
        streams_root(settings.data_dir).mkdir(parents=True, exist_ok=True)
        self._flusher = Flusher(settings.flush_interval_ms)

    # ------------------------------------------------------------------ helpers

    def _directory(self, name: str) -> Path:
        try:
            return stream_dir(self.settings.data_dir, name)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None

    def _name_lock(self, name: str) -> threading.Lock:
        with self._lock:
            if self._closed:
                raise ShuttingDownError("storage is closed")
            return self._name_locks.setdefault(name, threading.Lock())

    def _open_unlocked(self, name: str, config: StreamConfig,
                       value_schemas: ValueSchemas = UNTYPED) -> StreamLog:
        """Open (recover) ``name``; the caller holds its name lock and it is not open."""
        directory = stream_dir(self.settings.data_dir, name)
        loaded = load_log(directory, self._cache, self.settings.index_interval_bytes, name)
        stream_log = StreamLog(
            name, config, directory, loaded, settings=self.settings, cache=self._cache,
            clock=self._clock, on_dirty=self._flusher.mark_dirty, value_schemas=value_schemas,
        )
        with self._lock:
            self._logs[name] = stream_log
            self._idle_due.pop(name, None)
        return stream_log

    # ------------------------------------------------------------------ contract

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
        with self._name_lock(name):
            with self._lock:
                existing = self._logs.get(name)
            if existing is not None:
                if existing.config != config:
                    existing.update_config(config)
                if existing.value_schemas.values.keys() != value_schemas.values.keys():
                    existing.set_value_schemas(value_schemas)
                return existing
            return self._open_unlocked(name, config, value_schemas)

    def close_log(self, name: str) -> None:
        """Flush and close ``name`` if it is open (its files stay)."""
        with self._name_lock(name):
            with self._lock:
                stream_log = self._logs.pop(name, None)
            if stream_log is not None:
                stream_log.close()

    def drop_log(self, name: str) -> None:
        """Close ``name`` and delete all its files."""
        directory = self._directory(name)
        with self._name_lock(name):
            with self._lock:
                stream_log = self._logs.pop(name, None)
                self._idle_due.pop(name, None)
            if stream_log is not None:
                stream_log.close(dropped=True)
            self._cache.forget_under(directory)
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(directory)
                fsync_dir(streams_root(self.settings.data_dir))
        log.info("stream %s: dropped, files deleted", name)

    def repair_log(self, name: str, config: StreamConfig,
                   value_schemas: ValueSchemas = UNTYPED) -> tuple[int, str]:
        """Truncate ``name`` at its first bad frame; (truncated_bytes, "file@position").

        The log is closed for the repair and open again afterwards.
        """
        directory = self._directory(name)
        with self._name_lock(name):
            with self._lock:
                stream_log = self._logs.pop(name, None)
            if stream_log is not None:
                stream_log.close()
            result = repair_log(directory, self._cache,
                                self.settings.index_interval_bytes, name)
            self._open_unlocked(name, config, value_schemas)
        return result

    def enforce_retention(self) -> None:
        """One retention pass over every stream: open logs, then streams not open."""
        now = self._clock()
        with self._lock:
            open_logs = list(self._logs.values())
        for stream_log in open_logs:
            try:
                stream_log.apply_retention(now)
            except (OSError, BrokerError) as exc:
                log.error("stream %s: retention failed: %s", stream_log.name, exc)
        self._enforce_idle_retention(now)

    def _enforce_idle_retention(self, now: int) -> None:
        try:
            names = os.listdir(streams_root(self.settings.data_dir))
        except FileNotFoundError:
            return
        for name in names:
            with self._lock:
                if self._closed or name in self._logs or self._idle_due.get(name, 0) > now:
                    continue
            if not STREAM_NAME_RE.fullmatch(name):
                continue
            directory = stream_dir(self.settings.data_dir, name)
            config = read_retention_config(directory)
            if config is None:
                continue
            try:
                with self._name_lock(name):
                    with self._lock:
                        if name in self._logs:
                            continue
                    check = idle_stream_check(directory, config, now)
                    if check.must_open:
                        stream_log = self._open_unlocked(name, config, self._schemas_of(name))
                        stream_log.apply_retention(now)
                        with self._lock:
                            self._logs.pop(name, None)
                        stream_log.close()
                        check = idle_stream_check(directory, config, now)
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
        with self._lock:
            return sorted(self._logs)

    def close(self) -> None:
        """Flush, fsync and close every log; the storage cannot be used afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            logs = list(self._logs.values())
            self._logs.clear()
        self._flusher.close()
        for stream_log in logs:
            try:
                stream_log.close()
            except (OSError, BrokerError) as exc:
                log.error("stream %s: close failed: %s", stream_log.name, exc)
        self._cache.close()

"""StreamLog: one stream's log, a facade over the parts that do the work.

Shaped like Kafka's UnifiedLog over LocalLog and its segments:

- ``SegmentStore`` (segment_store.py): the segment files, the append lock,
  the current view, durability (fsync through a write sequence), the config,
  value schemas and dedup window, close; the concurrency model is there;
- ``Appender`` (appender.py): the one entry point of every append and the
  group-commit queue behind it (framed rows: framed_append.py);
- ``LogReader`` (log_reader.py): reads over the current immutable view;
- ``Truncation`` (truncation.py): start offset moves, retention, truncation.

Each part holds the store, none holds another, so the only references back
are the commit queue's weak one to its appender: an evicted log is freed as
soon as its last user drops it.

Data is visible to readers as soon as it is written to the file (before the
fsync); an append with AckMode.FSYNC returns only after the covering fsync,
one with AckMode.WRITE after the write, and WRITE data is fsynced by the
storage's flusher within ``flush_interval_ms``.

Typed streams (docs/typed-streams.md): the broker's registry gives the log
its value schemas (``value_schemas`` at open, ``set_value_schemas`` on a
change). An append converts its values to the current version's struct
before it is queued (nothing stored when a value does not fit) and is written
with that version in the frame header; the lean paths for lone messages and
few Python values are for untyped streams only. Every decode uses the
frame's version (LogView.schemas); ``read(..., latest=True)`` converts older
versions' batches to the current version.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from npstream.broker.storage.appender import RECENT_MAX_BYTES, AppendData, Appender
from npstream.broker.storage.log_reader import LogReader
from npstream.broker.storage.reader import FileSpan
from npstream.broker.storage.results import AppendResult, LogStats, ReadResult, StoredRow
from npstream.broker.storage.segment_store import SegmentStore
from npstream.broker.storage.settings import AckMode, StreamConfig
from npstream.broker.storage.staged_segment import StagedSegment
from npstream.broker.storage.truncation import Truncation
from npstream.broker.storage.value_schemas import ValueSchemas
from npstream.proto.defaults import DEFAULT_FETCH_BYTES, DEFAULT_FETCH_MESSAGES

__all__ = ["RECENT_MAX_BYTES", "StreamLog"]


class StreamLog:
    """The log of one stream (module docstring). Thread-safe; obtained from Storage.open_log."""

    __slots__ = ("__weakref__", "_appender", "_reader", "_store", "_truncation", "name")

    def __init__(self, store: SegmentStore, *,
                 on_dirty: Callable[[Any], None] | None = None) -> None:
        """The log over ``store`` (opened by Storage from what load_log recovered);
        ``on_dirty(store)`` after each write acknowledged before its fsync (the flusher)."""
        self.name = store.name
        self._store = store
        self._appender = Appender(store, on_dirty)
        self._reader = LogReader(store)
        self._truncation = Truncation(store)

    # ------------------------------------------------------------------ state

    @property
    def config(self) -> StreamConfig:
        return self._store.config

    @property
    def value_schemas(self) -> ValueSchemas:
        """The stream's value schemas (UNTYPED for an untyped stream)."""
        return self._store.schemas

    @property
    def start_offset(self) -> int:
        return self._store.view.start

    @property
    def end_offset(self) -> int:
        return self._store.view.end

    @property
    def directory(self) -> Path:
        return self._store.directory

    @property
    def failed(self) -> bool:
        """True after a disk error (a failed fsync or undo): writes are refused until the
        log is reopened, and bytes of the failed write may be in the files."""
        return self._store.failure is not None

    def check_writable(self) -> None:
        """Raise the error a write would get now (closed, or failed after a disk error)."""
        self._store.check_usable()

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
        self._store.set_value_schemas(schemas, before_change)

    def update_config(self, config: StreamConfig) -> None:
        self._store.update_config(config)

    def close(self, *, dropped: bool = False) -> None:
        """Flush, record a clean shutdown and refuse further use."""
        self._store.close(dropped=dropped)

    # ------------------------------------------------------------------ appends, durability

    def append(self, data: AppendData, ack: AckMode = AckMode.FSYNC) -> AppendResult:
        """Store ``data``: rows (normalize_publish_table output, or Python values for the
        lean small-append path) or framed rows (a FramedAppend); see appender.py."""
        return self._appender.append(data, ack)

    def can_adopt(self, staged: StagedSegment, min_bytes: int) -> bool:
        """Whether a FramedAppend should adopt ``staged`` rather than copy it (segment_store)."""
        return self._store.can_adopt(staged, min_bytes)

    def sync_through(self, sequence: int) -> None:
        """Return once every write up to ``sequence`` (AppendResult.write_sequence) is fsynced."""
        self._store.sync_through(sequence)

    def needs_sync(self) -> bool:
        return self._store.needs_sync()

    def flush(self) -> None:
        """fsync everything written so far."""
        self._store.flush()

    # ------------------------------------------------------------------ reads

    def read(self, offset: int, *, max_messages: int = DEFAULT_FETCH_MESSAGES,
             max_bytes: int = DEFAULT_FETCH_BYTES, end_offset: int | None = None,
             latest: bool = False, whole: bool = False) -> ReadResult:
        """Stored batches from ``offset``; OffsetOutOfRangeError outside [start, end]."""
        return self._reader.read(offset, max_messages=max_messages, max_bytes=max_bytes,
                                 end_offset=end_offset, latest=latest, whole=whole)

    def recent_rows(self, offset: int) -> pa.RecordBatch | list[StoredRow] | None:
        """Rows [offset, end) if the last write holds them all, else None (log_reader.py)."""
        return self._reader.recent_rows(offset)

    def locate(self, offset: int, *, max_messages: int = DEFAULT_FETCH_MESSAGES,
               end_offset: int | None = None) -> tuple[list[FileSpan], int]:
        """File spans holding [offset, stop) and stop, for same-host readers (reader.py)."""
        return self._reader.locate(offset, max_messages=max_messages, end_offset=end_offset)

    def read_table(self, offset: int, end_offset: int) -> pa.Table:
        """Messages [offset, end_offset) (up to the end of the log) as one table."""
        return self._reader.read_table(offset, end_offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """First offset with timestamp >= ``timestamp_ms``; end_offset if none."""
        return self._reader.offset_for_timestamp(timestamp_ms)

    def timestamp_at(self, offset: int) -> int:
        """Append time (epoch ms) of the message at ``offset``; 0 when none is stored there."""
        return self._reader.timestamp_at(offset)

    def stats(self) -> LogStats:
        return self._reader.stats()

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """True as soon as end_offset > offset (woken by appends), False on timeout."""
        return self._store.wait_for_data(offset, timeout_s)

    def add_append_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every change of the view (appends, deletions).

        It runs in the writing thread, under the append lock, right after the
        data became visible: a waiter woken by it reacts without the hand-off
        through a watcher thread that ``wait_for_data`` would need (shared
        groups wait on their own condition). It must be quick, must not raise
        and must never wait for anything that holds this log's append lock.
        """
        self._store.add_listener(listener)

    def remove_append_listener(self, listener: Callable[[], None]) -> None:
        self._store.remove_listener(listener)

    # ------------------------------------------------------------------ deletion, retention

    def delete_before(self, offset: int) -> None:
        """Make ``offset`` the start offset; delete the segments wholly below it."""
        self._truncation.delete_before(offset)

    def delete_all(self) -> None:
        """Make start_offset = end_offset; later appends continue from the same end offset."""
        self._truncation.delete_all()

    def truncate_to(self, offset: int) -> None:
        """Drop messages [offset, end): the end offset becomes ``offset`` (truncation.py)."""
        self._truncation.truncate_to(offset)

    def apply_retention(self, now_ms: int) -> int:
        """Delete the segments retention no longer keeps; returns how many were deleted."""
        return self._truncation.apply_retention(now_ms)

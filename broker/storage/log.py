"""StreamLog: one stream's log - appends (group commit), reads, deletion, truncation, retention.

Concurrency model:

- ``_append_lock`` serialises everything that changes the log: the group-commit
  leader's write, roll, deletion, truncation, retention, config changes.
- Readers take no lock: they use the current ``LogView`` (reader.py), replaced
  under ``_state`` after each change; ``_state`` is also the condition that
  ``wait_for_data`` sleeps on.
- fsync runs outside the append lock under ``_sync_lock`` (the group-commit
  leader's, or the flusher's for WRITE-mode data; group_commit.py).
  ``_written_seq`` counts written groups; ``_synced_seq`` is the last count
  known durable. Rolling a segment fsyncs it first, so syncing the current
  tail covers everything written.

Timestamps are broker append times: max(clock(), last timestamp), one per
written group, so they never decrease within a stream. Data is visible to
readers as soon as it is written to the file (before the fsync); an append
with AckMode.FSYNC returns only after the covering fsync, one with
AckMode.WRITE after the write, and WRITE data is fsynced by the storage's
flusher within ``flush_interval_ms``.
"""

from __future__ import annotations

import errno
import logging
import secrets
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from npstream.broker.errors import (
    BrokerError,
    CorruptRecordError,
    OffsetOutOfRangeError,
    ShuttingDownError,
    StreamNotFoundError,
)
from npstream.broker.storage.append_plan import (
    PendingAppend,
    PlannedRows,
    plan_append,
    prepare_append,
)
from npstream.broker.storage.batch_builder import (
    build_message_batch,
    complete_publish_table,
    decode_payload,
    reencode_rows,
    serialize_frames,
)
from npstream.broker.storage.dedup import DedupWindow
from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.files import fsync_dir
from npstream.broker.storage.group_commit import CommitQueue, CommitRequest
from npstream.broker.storage.loader import LoadedLog
from npstream.broker.storage.reader import (
    LogView,
    iter_frames,
    offset_for_timestamp,
    read_range,
    timestamp_at,
)
from npstream.broker.storage.record_batch import FLAG_PRODUCER_IDS, encode_frame
from npstream.broker.storage.results import AppendResult, LogStats, ReadResult
from npstream.broker.storage.retention import plan_retention
from npstream.broker.storage.segment import FaultHook, Segment
from npstream.broker.storage.settings import (
    SCAN_CHUNK_BYTES,
    AckMode,
    StorageSettings,
    StreamConfig,
)
from npstream.broker.storage.stream_files import (
    CleanShutdown,
    read_retention_config,
    write_clean_shutdown,
    write_retention_config,
    write_schema,
    write_start_offset,
)
from npstream.schema import MESSAGE_SCHEMA

__all__ = ["StreamLog"]

log = logging.getLogger(__name__)

_MAX_RELATIVE_OFFSET = 2**32 - 1
_READ_TABLE_BYTES = 64 << 20


class StreamLog:
    """The log of one stream. Thread-safe; obtained from Storage.open_log."""

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
        fault_hook: FaultHook | None = None,
        on_dirty: Callable[[StreamLog], None] | None = None,
    ) -> None:
        self.name = name
        self._config = config
        self._directory = directory
        self._settings = settings
        self._cache = cache
        self._clock = clock
        self._fault_hook = fault_hook
        self._on_dirty = on_dirty
        self._segments: list[Segment] = loaded.segments
        self._last_timestamp = max((s.max_timestamp for s in self._segments), default=-1)
        self._append_lock = threading.RLock()
        self._state = threading.Condition()
        self._view = LogView(
            loaded.start_offset, loaded.end_offset, tuple(self._segments),
            self._segments[-1].size if self._segments else 0,
        )
        self._sync_lock = threading.Lock()
        self._written_seq = 0
        self._synced_seq = 0
        self._queue: CommitQueue[PendingAppend] = CommitQueue(
            settings.max_batch_bytes, self._write_group, self._sync_through
        )
        self._id_prefix = secrets.token_hex(8).encode()
        self._closed: BrokerError | None = None
        self._failure: OSError | None = None
        self._first_timestamp: tuple[int, int] = (-1, 0)  # (start offset, its timestamp)
        self._dedup: DedupWindow | None = None
        if directory.exists() and read_retention_config(directory) != config:
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
    def end_offset(self) -> int:
        return self._view.end

    @property
    def directory(self) -> Path:
        return self._directory

    # ------------------------------------------------------------------ appends

    def append(self, data: pa.Table, ack: AckMode = AckMode.FSYNC) -> AppendResult:
        """Store the rows of ``data`` (normalize_publish_table output); see docs/internals.md."""
        self._check_usable()
        config = self._config
        pending = prepare_append(data, self.name, config.max_message_bytes,
                                 find_repeats=config.dedup_window_ms > 0)
        if pending.table.num_rows == 0:
            return AppendResult(self.end_offset, 0, [], max(self._clock(), self._last_timestamp))
        request = CommitRequest(pending, pending.table.get_total_buffer_size(),
                                fsync=ack is AckMode.FSYNC)
        return self._queue.submit(request)  # type: ignore[return-value]

    def append_atomic(
        self, tables: list[pa.Table], before_write: Callable[[int], None] | None = None
    ) -> AppendResult:
        """Store all rows of all tables contiguously and fsync them; no dedup is applied.

        ``before_write(first_offset)`` runs under the append lock before any
        byte is written; if it raises, nothing is written.
        """
        self._check_usable()
        if not tables:
            tables = [pa.table({"value": pa.array([], pa.binary())})]
        combined = pa.concat_tables([complete_publish_table(t) for t in tables])
        pending = prepare_append(combined, self.name, self._config.max_message_bytes,
                                 find_repeats=False, atomic=True, before_write=before_write)
        request = CommitRequest(pending, pending.table.get_total_buffer_size(), fsync=True,
                                atomic=True)
        return self._queue.submit(request)  # type: ignore[return-value]

    def _write_group(self, group: list[CommitRequest[PendingAppend]]) -> int:
        """Leader: plan, frame and write one group; returns its write sequence number."""
        with self._append_lock:
            self._check_usable()
            now = max(self._clock(), self._last_timestamp)
            window = self._dedup
            if window is not None:
                window.expire(now)
            first = self._view.end
            next_offset = first
            pending_ids: dict[str, int] | None = {} if len(group) > 1 else None
            planned: list[PlannedRows] = []
            for request in group:
                rows = plan_append(request.payload, next_offset, window, pending_ids)
                request.result = AppendResult(next_offset, rows.table.num_rows,
                                              rows.duplicates, now)
                next_offset += rows.table.num_rows
                if rows.table.num_rows:
                    planned.append(rows)
            for request in group:
                if request.payload.before_write is not None:
                    request.payload.before_write(first)
            if not planned:
                return self._written_seq
            self._write_rows_locked(planned, first, now)
            self._written_seq += 1
            sequence = self._written_seq
            self._publish_view_locked()
        if self._on_dirty is not None and not all(request.fsync for request in group):
            self._on_dirty(self)
        return sequence

    def _write_rows_locked(self, planned: list[PlannedRows], first: int, now: int) -> None:
        """Write the planned rows as frames of at most max_batch_bytes; all or nothing."""
        table = planned[0].table if len(planned) == 1 else pa.concat_tables(
            [rows.table for rows in planned]
        )
        supplied = None
        if any(rows.supplied is not None for rows in planned):
            supplied = pa.concat_arrays([  # one entry per append of the group
                rows.supplied if rows.supplied is not None
                else pa.array(np.zeros(rows.table.num_rows, dtype=bool))
                for rows in planned
            ])
        batch = build_message_batch(table, first, now, self._id_prefix)
        self._ensure_active_segment_locked()
        segment_count = len(self._segments)
        tail_size = self._segments[-1].size
        flagged: list[pa.RecordBatch] = []
        try:
            for start, count, payload in serialize_frames(batch, self._settings.max_batch_bytes):
                flags = 0
                if supplied is not None and pc.any(supplied.slice(start, count)).as_py():
                    flags = FLAG_PRODUCER_IDS
                    flagged.append(batch.slice(start, count))
                header_bytes, header = encode_frame(
                    payload, base_offset=first + start, count=count,
                    min_timestamp=now, max_timestamp=now, flags=flags,
                )
                self._maybe_roll_locked(header.frame_size, header.count, now)
                self._segments[-1].write_frame(
                    self._cache, header_bytes, payload, header,
                    self._settings.index_interval_bytes, self._fault_hook,
                )
        except OSError:
            self._roll_back_locked(segment_count, tail_size)
            raise
        self._last_timestamp = now
        if self._dedup is not None:
            for part in flagged:
                base = part.column(0)[0].as_py()
                self._dedup.remember(now, part.column(1).to_pylist(),
                                     list(range(base, base + part.num_rows)))

    def _roll_back_locked(self, segment_count: int, tail_size: int) -> None:
        """Undo a group that failed half way: nothing of it may stay in the files."""
        try:
            for segment in self._segments[segment_count:]:
                segment.delete(self._cache)
            del self._segments[segment_count:]
            tail = self._segments[-1]
            if tail.size != tail_size or tail.sealed:
                tail.delete_index_files()
                tail.truncate_file(self._cache, tail_size)
                self._segments[-1] = self._rescan(tail.base_offset)
        except (OSError, BrokerError) as exc:
            self._fail(exc if isinstance(exc, OSError) else OSError(errno.EIO, str(exc)))

    def _maybe_roll_locked(self, frame_size: int, count: int, timestamp: int) -> None:
        tail = self._segments[-1]
        if tail.is_empty:
            return
        reason = None
        if tail.size + frame_size > self._settings.segment_bytes:
            reason = f"size: {tail.size} + {frame_size} bytes > segment_bytes"
        elif timestamp - tail.first_timestamp >= self._settings.segment_ms:
            reason = f"age: first message at {tail.first_timestamp} ms, now {timestamp} ms"
        elif tail.next_offset + count - tail.base_offset > _MAX_RELATIVE_OFFSET:
            reason = "relative offsets would overflow"
        if reason is not None:
            self._roll_locked(reason)

    def _roll_locked(self, reason: str) -> None:
        """Close the tail segment (fsync, seal) and start a new one at the end offset."""
        old = self._segments[-1]
        old.sync(self._cache, self._fault_hook)
        old.seal()
        new = Segment(self._directory, old.next_offset)
        new.create_file(self._cache)
        fsync_dir(self._directory)
        self._segments.append(new)
        log.info("stream %s: rolled segment %s (offsets [%d, %d), %d bytes; %s); "
                 "new segment starts at offset %d", self.name, old.path.name, old.base_offset,
                 old.next_offset, old.size, reason, new.base_offset)

    def _ensure_active_segment_locked(self) -> None:
        if self._segments:
            return
        created = not self._directory.exists()
        self._directory.mkdir(parents=True, exist_ok=True)
        write_schema(self._directory)
        write_retention_config(self._directory, self._config)
        segment = Segment(self._directory, self._view.end)
        segment.create_file(self._cache)
        fsync_dir(self._directory)
        if created:
            fsync_dir(self._directory.parent)
        self._segments.append(segment)

    # ------------------------------------------------------------------ durability

    def _sync_through(self, sequence: int) -> None:
        """Return once every group up to write ``sequence`` is fsynced."""
        with self._sync_lock:
            if self._synced_seq >= sequence:
                return
            target = self._written_seq
            if self._segments:
                try:
                    self._segments[-1].sync(self._cache, self._fault_hook)
                except OSError as exc:
                    self._fail(exc)
                    raise
            self._synced_seq = target

    def needs_sync(self) -> bool:
        return self._synced_seq < self._written_seq

    def flush(self) -> None:
        """fsync everything written so far."""
        self._sync_through(self._written_seq)

    def _fail(self, exc: OSError) -> None:
        if self._failure is None:
            self._failure = exc
            log.error("stream %s: disk error, the log refuses writes until it is reopened: %s",
                      self.name, exc)

    # ------------------------------------------------------------------ reads

    def read(self, offset: int, *, max_messages: int = 10000, max_bytes: int = 8 << 20,
             end_offset: int | None = None) -> ReadResult:
        """Stored batches from ``offset``; OffsetOutOfRangeError outside [start, end]."""
        self._check_readable()
        try:
            return read_range(self._view, self._cache, self.name, offset,
                              max_messages=max_messages, max_bytes=max_bytes,
                              end_offset=end_offset)
        except FileNotFoundError:  # retention deleted the segment under the read
            view = self._view
            raise OffsetOutOfRangeError(self.name, offset, view.start, view.end) from None

    def read_table(self, offset: int, end_offset: int) -> pa.Table:
        """Messages [offset, end_offset) (up to the end of the log) as one table."""
        batches: list[pa.RecordBatch] = []
        position = offset
        while position < end_offset:
            result = self.read(position, max_messages=end_offset - position,
                               max_bytes=_READ_TABLE_BYTES, end_offset=end_offset)
            if result.count == 0:
                break
            batches.extend(map(decode_payload, result.batches))
            position = result.next_offset
        return pa.Table.from_batches(batches, schema=MESSAGE_SCHEMA)

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """True as soon as end_offset > offset (woken by appends), False on timeout."""
        with self._state:
            self._state.wait_for(
                lambda: self._view.end > offset or self._closed is not None, timeout_s
            )
            return self._view.end > offset

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """First offset with timestamp >= ``timestamp_ms``; end_offset if none."""
        self._check_readable()
        return offset_for_timestamp(self._view, self._cache, timestamp_ms)

    def stats(self) -> LogStats:
        view = self._view
        if not view.segments:
            return LogStats(view.start, view.end, 0, 0, 0, 0)
        size = sum(segment.size for segment in view.segments[:-1]) + view.tail_size
        first = last = 0
        if view.start < view.end:
            cached_start, cached = self._first_timestamp
            if cached_start != view.start:
                cached = timestamp_at(view, self._cache, view.start)
                self._first_timestamp = (view.start, cached)
            first = cached
            last = max(s.max_timestamp for s in view.segments[-2:])
        return LogStats(view.start, view.end, size, first, last, len(view.segments))

    # ------------------------------------------------------------------ deletion

    def delete_before(self, offset: int) -> None:
        """Make ``offset`` the start offset; delete the segments wholly below it."""
        with self._append_lock:
            self._check_usable()
            view = self._view
            if offset < 0 or offset > view.end:
                raise OffsetOutOfRangeError(self.name, offset, view.start, view.end)
            if offset <= view.start:
                return
            if offset == view.end:
                self._delete_all_locked(f"delete_before({offset})")
                return
            write_start_offset(self._directory, offset)
            self._publish_view_locked(start=offset)
            if self._dedup is not None:
                self._dedup.forget_below(offset)
            doomed = 0
            while self._segments[doomed].next_offset <= offset:
                doomed += 1
            self._delete_head_locked(doomed, f"delete_before({offset})")

    def delete_all(self) -> None:
        """Make start_offset = end_offset; later appends continue from the same end offset."""
        with self._append_lock:
            self._check_usable()
            self._delete_all_locked("delete_all")

    def _delete_all_locked(self, reason: str) -> None:
        if not self._segments:
            return
        if not self._segments[-1].is_empty:
            self._roll_locked(reason)
        end = self._view.end
        write_start_offset(self._directory, end)
        if self._dedup is not None:
            self._dedup.clear()
        self._delete_head_locked(len(self._segments) - 1, reason)
        self._publish_view_locked(start=end)

    def _delete_head_locked(self, count: int, reason: str) -> None:
        """Drop the first ``count`` (closed) segments: from the view first, then the files."""
        if count <= 0:
            return
        doomed = self._segments[:count]
        del self._segments[:count]
        start = max(self._view.start, self._segments[0].base_offset)
        self._publish_view_locked(start=start)
        if self._dedup is not None:
            self._dedup.forget_below(start)
        for segment in doomed:
            segment.delete(self._cache)
        fsync_dir(self._directory)
        log.info("stream %s: %s deleted %d segment(s) with offsets [%d, %d) (%d bytes); "
                 "start offset is %d", self.name, reason, count, doomed[0].base_offset,
                 doomed[-1].next_offset, sum(segment.size for segment in doomed), start)

    def truncate_to(self, offset: int) -> None:
        """Drop messages [offset, end): the end offset becomes ``offset`` (sink recovery)."""
        with self._append_lock:
            self._check_usable()
            view = self._view
            if offset < view.start or offset > view.end:
                raise OffsetOutOfRangeError(self.name, offset, view.start, view.end)
            if offset == view.end:
                return
            self.flush()
            number = view.segment_number(offset)
            segment = self._segments[number]
            cut, kept = segment.size, b""
            frame_header = None
            for _segment, position, header, payload in iter_frames(view, self._cache, offset):
                cut, frame_header = position, header
                if header.base_offset < offset:
                    kept = reencode_rows(decode_payload(payload), 0, offset - header.base_offset)
                break
            for later in self._segments[number + 1 :]:
                later.delete(self._cache)
            del self._segments[number + 1 :]
            segment.delete_index_files()
            segment.truncate_file(self._cache, cut)
            rebuilt = self._rescan(segment.base_offset)
            if kept and frame_header is not None:
                header_bytes, header = encode_frame(
                    kept, base_offset=frame_header.base_offset,
                    count=offset - frame_header.base_offset,
                    min_timestamp=frame_header.min_timestamp,
                    max_timestamp=frame_header.max_timestamp, flags=frame_header.flags,
                )
                rebuilt.write_frame(self._cache, header_bytes, kept, header,
                                    self._settings.index_interval_bytes, self._fault_hook)
                rebuilt.sync(self._cache, self._fault_hook)
            self._segments[number] = rebuilt
            fsync_dir(self._directory)
            if self._dedup is not None:
                self._dedup.forget_from(offset)
            removed = view.end - offset
            self._publish_view_locked()
            log.info("stream %s: truncated to offset %d (%d messages removed)",
                     self.name, offset, removed)

    def _rescan(self, base_offset: int) -> Segment:
        segment, bad = Segment.scan(self._directory, base_offset, self._cache,
                                    self._settings.index_interval_bytes)
        if bad is not None:
            raise CorruptRecordError(segment.path, bad.position, bad.detail)
        return segment

    # ------------------------------------------------------------------ retention, config

    def apply_retention(self, now_ms: int) -> int:
        """Delete the segments retention no longer keeps; returns how many were deleted."""
        with self._append_lock:
            if self._closed is not None or self._failure is not None or not self._segments:
                return 0
            plan = plan_retention(self._segments, self._config, now_ms, self._view.start)
            if plan.expire_tail:
                self._delete_all_locked(f"retention ({plan.reason})")
                return plan.delete_count
            self._delete_head_locked(plan.delete_count, f"retention ({plan.reason})")
            return plan.delete_count

    def update_config(self, config: StreamConfig) -> None:
        with self._append_lock:
            old, self._config = self._config, config
            if config != old and self._directory.exists():
                write_retention_config(self._directory, config)
            if config.dedup_window_ms != old.dedup_window_ms:
                self._reset_dedup_locked()

    def _reset_dedup_locked(self) -> None:
        """Rebuild the dedup window from the flagged batches stored inside it."""
        window_ms = self._config.dedup_window_ms
        if window_ms <= 0:
            self._dedup = None
            return
        window = DedupWindow(window_ms)
        view = self._view
        cutoff = self._clock() - window_ms  # batches stored at or before this have expired
        first = offset_for_timestamp(view, self._cache, cutoff + 1)
        for _segment, _position, header, payload in iter_frames(
            view, self._cache, first, read_size=SCAN_CHUNK_BYTES
        ):
            if not header.has_producer_ids or header.max_timestamp <= cutoff:
                continue
            skip = max(0, view.start - header.base_offset)
            ids = decode_payload(payload).column("id").slice(skip).to_pylist()
            window.remember(header.max_timestamp, ids,
                            list(range(header.base_offset + skip, header.next_offset)))
        self._dedup = window

    # ------------------------------------------------------------------ lifecycle

    def close(self, *, dropped: bool = False) -> None:
        """Flush, record a clean shutdown and refuse further use."""
        with self._append_lock:
            if self._closed is not None:
                return
            if not dropped:
                if self._failure is None:
                    self.flush()
                if self._segments and self._failure is None:
                    tail = self._segments[-1]
                    write_clean_shutdown(self._directory, CleanShutdown(
                        tail.base_offset, tail.size, tail.next_offset, tail.max_timestamp))
            self._closed = (StreamNotFoundError(self.name) if dropped
                            else ShuttingDownError(f"stream '{self.name}' is closed"))
            with self._state:
                self._state.notify_all()
        self._cache.forget_under(self._directory)

    def _publish_view_locked(self, start: int | None = None) -> None:
        tail = self._segments[-1] if self._segments else None
        view = LogView(
            self._view.start if start is None else start,
            tail.next_offset if tail is not None else self._view.end,
            tuple(self._segments),
            tail.size if tail is not None else 0,
        )
        with self._state:
            self._view = view
            self._state.notify_all()

    def _check_readable(self) -> None:
        if self._closed is not None:
            raise self._closed

    def _check_usable(self) -> None:
        if self._closed is not None:
            raise self._closed
        if self._failure is not None:
            raise OSError(errno.EIO, f"stream '{self.name}' refuses writes after a disk error "
                          f"({self._failure}); restart the broker to recover it")

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

import errno
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from itertools import accumulate, groupby
from pathlib import Path
from typing import TypeVar, cast

import numpy as np
import pyarrow as pa

from npstream.broker.errors import (
    BrokerError,
    DiskFullError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    ShuttingDownError,
    StreamNotFoundError,
    ValueMismatchError,
    is_disk_full,
)
from npstream.broker.log_events import event_fields
from npstream.broker.storage.append_plan import (
    PendingAppend,
    PlannedRows,
    plan_append,
    prepare_append,
    typed_values,
)
from npstream.broker.storage.batch_builder import (
    build_message_batch,
    complete_publish_table,
)
from npstream.broker.storage.dedup import DedupWindow, rebuild_window
from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.group_commit import CommitQueue, CommitRequest
from npstream.broker.storage.loader import LoadedLog
from npstream.broker.storage.prebuilt import PrebuiltFrame
from npstream.broker.storage.reader import (
    FileSpan,
    LogView,
    locate_range,
    offset_for_timestamp,
    read_stored_batches,
    timestamp_at,
)
from npstream.broker.storage.results import AppendResult, LogStats, ReadResult, StoredRow
from npstream.broker.storage.retention import plan_retention
from npstream.broker.storage.segment_list import SegmentList, UndoFailedError
from npstream.broker.storage.settings import AckMode, StorageSettings, StreamConfig
from npstream.broker.storage.small_append import (
    LoneMessage,
    MessageRows,
    build_stored_batch,
    lone_message,
    lone_payload,
    prepare_rows,
    remember_lone_template,
    rows_table,
)
from npstream.broker.storage.staged_segment import (
    StagedSegment,
    Stamp,
    check_sizes,
    stamp_all,
)
from npstream.broker.storage.stream_files import (
    CleanShutdown,
    read_retention_config,
    write_clean_shutdown,
    write_retention_config,
    write_start_offset,
)
from npstream.broker.storage.value_schemas import UNTYPED, ValueSchemas
from npstream.proto.defaults import DEFAULT_FETCH_BYTES, DEFAULT_FETCH_MESSAGES
from npstream.proto.frames.payload import decode_payload
from npstream.proto.value_schema import conform_batch

__all__ = ["StreamLog"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# What the group-commit queue carries: an append's checked rows, or one small
# message on the lean path (small_append.py).
_Payload = PendingAppend | LoneMessage

_READ_TABLE_BYTES = 8 << 20  # per read() of read_table: bounds the buffer, no slower
# A written batch up to this size stays in memory with the view it made (LogView.recent)
# until the next write: tail readers take it from there instead of reading the file
# back. Bounded so that an idle stream holds at most this much.
RECENT_MAX_BYTES = 1 << 20


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
        on_dirty: Callable[[StreamLog], None] | None = None,
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
        self._queue: CommitQueue[_Payload] = CommitQueue(
            settings.max_batch_bytes, self._write_group, self._sync_through
        )
        self._id_prefix_text = secrets.token_hex(8)
        self._id_prefix = self._id_prefix_text.encode()
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

    # ------------------------------------------------------------------ appends

    def append(self, data: pa.Table | MessageRows,
               ack: AckMode = AckMode.FSYNC) -> AppendResult:
        """Store ``data`` (normalize_publish_table output, or Python values for the lean
        small-append path); see docs/internals.md."""
        self._check_usable()
        pending = self._prepare(data)
        request: CommitRequest[_Payload]
        if isinstance(pending, LoneMessage):
            request = CommitRequest(pending, len(pending.value), fsync=ack is AckMode.FSYNC)
            return self._submit(request)
        if pending.table.num_rows == 0:
            return AppendResult(self.end_offset, 0, [], max(self._clock(), self._last_timestamp))
        request = CommitRequest(pending, pending.table.get_total_buffer_size(),
                                fsync=ack is AckMode.FSYNC)
        return self._submit(request)

    def append_unsynced(self, data: pa.Table | MessageRows) -> tuple[AppendResult, int]:
        """Write ``data`` like ``append(data, AckMode.WRITE)``; also return its write sequence.

        Pipelined publishes (PublishStream) write request k+1 while request k
        waits for its fsync: the caller acknowledges ``ack=fsync`` only after
        ``sync_through(sequence)`` returns, so durability is the same as
        append(FSYNC), and one fsync covers every request written meanwhile.
        Until then the log is registered with the flusher like WRITE data.
        """
        self._check_usable()
        pending = self._prepare(data)
        request: CommitRequest[_Payload]
        if isinstance(pending, LoneMessage):
            request = CommitRequest(pending, len(pending.value), fsync=False)
            result = self._submit(request)
            return result, max(request.sequence, 0)
        if pending.table.num_rows == 0:
            result = AppendResult(self.end_offset, 0, [],
                                  max(self._clock(), self._last_timestamp))
            return result, self._written_seq
        request = CommitRequest(pending, pending.table.get_total_buffer_size(), fsync=False)
        result = self._submit(request)
        return result, max(request.sequence, 0)

    def _submit(self, request: CommitRequest[_Payload]) -> AppendResult:
        """Queue ``request`` for group commit; its AppendResult once written (and synced)."""
        # The queue is generic over results (``object``); this log's writer,
        # _write_group_locked, sets every request's result to an AppendResult.
        return cast(AppendResult, self._queue.submit(request))

    def _prepare(self, data: pa.Table | MessageRows) -> _Payload:
        """Checked, completed rows of an append, from a table or from Python values."""
        config = self._config
        if self._typed:
            table = rows_table(data) if isinstance(data, MessageRows) else data
            return self._prepare_table(table, find_repeats=config.dedup_window_ms > 0)
        if isinstance(data, MessageRows):
            lone = lone_message(data, self.name, config.max_message_bytes)
            if lone is not None:
                return lone
            return prepare_rows(data, self.name, config.max_message_bytes,
                                find_repeats=config.dedup_window_ms > 0)
        return self._prepare_table(data, find_repeats=config.dedup_window_ms > 0)

    def _prepare_table(self, data: pa.Table, *, find_repeats: bool, atomic: bool = False,
                       before_write: Callable[[int], None] | None = None) -> PendingAppend:
        """prepare_append for this stream: its values converted first when it is typed."""
        schemas = self._schemas
        limit = self._config.max_message_bytes
        if not schemas.typed:
            if pa.types.is_struct(data.schema.field("value").type):
                raise InvalidArgumentError(
                    f"publish to stream '{self.name}': the value is a struct, but the stream "
                    "has no value schema (untyped streams store bytes); send bytes, or give "
                    "the stream a schema (docs/typed-streams.md)")
            return prepare_append(data, self.name, limit, find_repeats=find_repeats,
                                  atomic=atomic, before_write=before_write)
        version = schemas.current
        table, typed = typed_values(data, self.name, version, schemas.values[version],
                                    schemas.stored_schema(version))
        return prepare_append(table, self.name, limit, find_repeats=find_repeats,
                              atomic=atomic, before_write=before_write, typed=typed)

    def sync_through(self, sequence: int) -> None:
        """Return once every write up to ``sequence`` (from append_unsynced) is fsynced."""
        self._sync_through(sequence)

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
        if self._schemas.typed:  # each table's values converted, then one append
            parts = [self._prepare_table(t, find_repeats=False).table for t in tables]
            combined = pa.concat_tables(parts)
        else:
            combined = pa.concat_tables([complete_publish_table(t) for t in tables])
        pending = self._prepare_table(combined, find_repeats=False, atomic=True,
                                      before_write=before_write)
        request: CommitRequest[_Payload] = CommitRequest(
            pending, pending.table.get_total_buffer_size(), fsync=True, atomic=True)
        return self._submit(request)

    def append_prebuilt(
        self, parts: Sequence[PrebuiltFrame | StagedSegment],
        before_write: Callable[[int, int], None] | None = None, *,
        timestamp: int | None = None, expect_first: int | None = None,
    ) -> AppendResult:
        """append_atomic for rows already framed: stamped in place, not rebuilt.

        ``parts`` are frames to copy into the log (prebuilt.py) and staged files
        to adopt as segments (staged_segment.py), in offset order. Same promises
        as append_atomic: contiguous, nothing interleaved, no dedup, fsynced
        before return, ``before_write(first_offset, timestamp)`` under the append
        lock before any byte is written; MessageTooLargeError (nothing stored).
        ``timestamp`` (sink recovery: the interrupted commit's) replaces the
        clock if it is not older than the log's last timestamp. With
        ``expect_first``, ValueError unless the log ends there.

        A failure after some parts were written (an adoption cannot be undone:
        the staged file has moved) leaves the log refusing writes until it is
        reopened, like a disk error; a caller that recorded where the append
        started finishes it from there.
        """
        with self._append_lock:
            self._check_usable()
            self._check_prebuilt_versions(parts)
            check_sizes(parts, self.name, self._config.max_message_bytes,
                        self._schemas.stored_schema)
            now = max(self._clock() if timestamp is None else timestamp, self._last_timestamp)
            first = self._view.end
            if expect_first is not None and first != expect_first:
                raise ValueError(f"stream '{self.name}' ends at offset {first}, "
                                 f"not {expect_first}")
            if before_write is not None:
                before_write(first, now)
            count = sum(part.count for part in parts)
            if not count:
                return AppendResult(first, 0, [], now)
            with self._disk_full_as_error("append"):
                flagged = self._write_parts_locked(parts, first, now)
            self._remember_ids_locked(flagged, now)
            self._written_seq += 1
            sequence = self._written_seq
            self._publish_view_locked()
        self._sync_through(sequence)
        return AppendResult(first, count, [], now)

    def _check_prebuilt_versions(self, parts: Sequence[PrebuiltFrame | StagedSegment]) -> None:
        """InvalidArgumentError unless every frame is in a value schema version of this stream.

        Staged frames were framed for the stream's schema at Stage time; the
        sink checks at commit that the version still means the same schema
        (a stream deleted and re-created meanwhile), this is storage's own
        guard that no frame lands in a stream that could not decode it.
        """
        versions = {part.schema_version for part in parts if isinstance(part, PrebuiltFrame)}
        versions.update(slot.schema_version for part in parts
                        if isinstance(part, StagedSegment) for slot in part.slots)
        schemas = self._schemas
        wrong = sorted(v for v in versions if (v not in schemas.values if schemas.typed else v))
        if wrong:
            raise InvalidArgumentError(
                f"stream '{self.name}' is "
                + (f"typed (value schema versions {sorted(schemas.values)})" if schemas.typed
                   else "untyped")
                + f", but frames to append are in value schema version {wrong[0]}"
                + (" (0: untyped)" if not wrong[0] else "") + "; nothing was written")

    def can_adopt(self, staged: StagedSegment, min_bytes: int) -> bool:
        """Whether append_prebuilt should adopt ``staged`` as a segment rather than copy it.

        Adopting renames the file into this stream's directory, which cannot
        cross a filesystem. And every adopted file becomes a segment, so one
        whose payloads are under ``min_bytes`` is copied instead: a low-rate
        writer would otherwise leave thousands of tiny segments.
        """
        if staged.payload_bytes < min_bytes:
            return False
        try:
            return os.stat(staged.path).st_dev == os.stat(self._directory.parent).st_dev
        except FileNotFoundError:
            return False

    def _write_parts_locked(self, parts: Sequence[PrebuiltFrame | StagedSegment], first: int,
                            now: int) -> list[pa.RecordBatch]:
        """Write runs of frames and adopt staged files in order; see append_prebuilt."""
        flagged: list[pa.RecordBatch] = []
        bases = list(accumulate((part.count for part in parts), initial=first))
        staged = {index: part for index, part in enumerate(parts)
                  if isinstance(part, StagedSegment)}
        # Staged files are stamped first, all at once: nothing is in the log yet, so a
        # failure there leaves it unchanged, and the stamps' disk waits overlap.
        stamps = dict(zip(staged, stamp_all([(part, bases[i]) for i, part in staged.items()],
                                            now, self._schemas.stored_schema), strict=True))
        reached = first
        try:
            for begin, end, write in self._write_steps(parts, bases, stamps, now):
                flagged += self._write_locked(bases[begin], now, write)
                reached = bases[end]
        except BaseException as exc:
            if reached > first:  # part of the append is in the log and cannot be undone
                failure = exc if isinstance(exc, OSError) else OSError(
                    errno.EIO, f"append stopped at offset {reached} after writing part of "
                    f"it: {exc}")
                self._fail(failure)
            raise
        return flagged

    def _write_steps(self, parts: Sequence[PrebuiltFrame | StagedSegment], bases: list[int],
                     stamps: dict[int, Stamp], now: int,
                     ) -> Iterator[tuple[int, int, Callable[[], list[pa.RecordBatch]]]]:
        """(first part, part after the last, write) of each step of append_prebuilt.

        Each stamped file (every StagedSegment: ``stamps`` holds their indexes)
        is adopted alone; a run of frames is written at once.
        """
        run_start = 0
        frames: list[PrebuiltFrame] = []
        for i, part in enumerate(parts):
            if not isinstance(part, StagedSegment):
                if not frames:
                    run_start = i
                frames.append(part)
                continue
            if frames:
                yield run_start, i, partial(
                    self._segments.write_prebuilt, frames, bases[run_start], now,
                    self._schemas.stored_schema)
                frames = []
            yield i, i + 1, partial(self._segments.adopt, part, bases[i], stamps[i])
        if frames:
            yield run_start, len(parts), partial(
                self._segments.write_prebuilt, frames, bases[run_start], now,
                self._schemas.stored_schema)

    def _write_group(self, group: list[CommitRequest[_Payload]]) -> int:
        """Leader: plan, frame and write one group; returns its write sequence number."""
        with self._append_lock, self._disk_full_as_error("append"):
            sequence = self._write_group_locked(group)
        if sequence and self._on_dirty is not None and not all(r.fsync for r in group):
            self._on_dirty(self)
        return sequence or self._written_seq

    def _write_group_locked(self, group: list[CommitRequest[_Payload]]) -> int:
        """The group's write sequence number; 0 when nothing was written (all duplicates)."""
        self._check_usable()
        now = max(self._clock(), self._last_timestamp)
        window = self._dedup
        if window is not None:
            window.expire(now)
        first = self._view.end
        recent: pa.RecordBatch | StoredRow | None
        if self._typed:
            group = self._typed_members_locked(group)
            if not group:
                return 0
        if len(group) == 1 and isinstance(group[0].payload, LoneMessage):
            group[0].result = AppendResult(first, 1, [], now)
            recent = self._write_lone_locked(group[0].payload.value, first, now)
        else:
            next_offset = first
            pending_ids: dict[str, int] | None = {} if len(group) > 1 else None
            planned: list[PlannedRows] = []
            appends: list[PendingAppend] = []
            for request in group:
                payload = request.payload
                if isinstance(payload, LoneMessage):  # written with others: as rows
                    payload = request.payload = payload.pending()
                appends.append(payload)
                rows = plan_append(payload, next_offset, window, pending_ids)
                request.result = AppendResult(next_offset, rows.table.num_rows,
                                              rows.duplicates, now)
                next_offset += rows.table.num_rows
                if rows.table.num_rows:
                    planned.append(rows)
            for append in appends:
                if append.before_write is not None:
                    append.before_write(first)
            if not planned:
                return 0
            batch = self._write_rows_locked(planned, first, now)
            recent = (batch if batch is not None and batch.get_total_buffer_size()
                      <= RECENT_MAX_BYTES else None)
        self._written_seq += 1
        self._publish_view_locked(recent=recent)
        return self._written_seq

    def _typed_members_locked(
        self, group: list[CommitRequest[_Payload]]
    ) -> list[CommitRequest[_Payload]]:
        """The members of a typed stream's group that can be written; the others fail.

        Appends are converted to the current version before they queue; one
        converted to an older version (the schema evolved meanwhile) is
        written in that version, which reads convert like any older batch.
        Only an untyped append checked before the stream became typed cannot
        be written: it fails alone, nothing of it stored.
        """
        kept = []
        for request in group:
            payload = request.payload
            if isinstance(payload, LoneMessage) or not payload.schema_version:
                request.error = ValueMismatchError(
                    f"publish to stream '{self.name}': the stream became typed (value schema "
                    f"version {self._schemas.current}) while this publish was queued as "
                    "untyped bytes; nothing of it was stored: publish it again")
                continue
            kept.append(request)
        return kept

    def _write_lone_locked(self, value: bytes, first: int, now: int) -> StoredRow:
        """Write a lone message from its template (small_append.lone_payload); returns its row.

        Without a template for its value length yet, the payload is built the
        usual way and becomes the template for the next ones. The row, as
        Python values, is what a shared group following the tail hands out
        (LogView.recent): no decoding on either side.
        """
        payload = lone_payload(value, first, now, self._id_prefix)
        if payload is None:
            built = build_stored_batch(LoneMessage(value).pending().table, first, now,
                                       self._id_prefix).serialize()
            remember_lone_template(built)
            payload = built
        self._write_locked(first, now,
                           lambda: self._segments.write_payload(payload, first, 1, now))
        return StoredRow(first, f"{self._id_prefix_text}{first:016x}", None, value, {}, now)

    def _write_rows_locked(self, planned: list[PlannedRows], first: int,
                           now: int) -> pa.RecordBatch | None:
        """Build and write the stored batch of a group; returns it.

        A typed stream's group whose appends were converted to different
        schema versions (an evolution while they queued) is written as one
        batch per version run, and returns None (no single batch holds it).
        """
        version = planned[0].schema_version
        if any(rows.schema_version != version for rows in planned):
            for _version, group in groupby(planned, lambda r: r.schema_version):
                run = list(group)
                self._write_run_locked(run, first, now)
                first += sum(rows.table.num_rows for rows in run)
            return None
        return self._write_run_locked(planned, first, now)

    def _write_run_locked(self, planned: list[PlannedRows], first: int,
                          now: int) -> pa.RecordBatch:
        """Build and write the stored batch of rows in one schema version; returns it."""
        table = planned[0].table if len(planned) == 1 else pa.concat_tables(
            [rows.table for rows in planned]
        )
        version = planned[0].schema_version
        supplied = None
        if any(rows.supplied is not None for rows in planned):
            supplied = pa.concat_arrays([  # one entry per append of the group
                rows.supplied if rows.supplied is not None
                else pa.array(np.zeros(rows.table.num_rows, dtype=bool))
                for rows in planned
            ])
        if version:
            batch = build_message_batch(table, first, now, self._id_prefix,
                                        self._schemas.stored_schema(version))
        else:
            batch = build_stored_batch(table, first, now, self._id_prefix)
        flagged = self._write_locked(
            first, now, lambda: self._segments.write_batch(batch, supplied, now, version))
        self._remember_ids_locked(flagged, now)
        return batch

    def _write_locked(self, first: int, now: int, write: Callable[[], _T]) -> _T:
        """Run ``write`` at the tail (rolling the segment first when due).

        A write whose undo failed leaves bytes of unknown state in the file,
        so the log refuses writes from then on (``failed``); any other error
        left nothing behind.
        """
        self._segments.ensure_active(first, self._config)
        try:
            result = write()
        except UndoFailedError as exc:
            self._fail(exc)
            raise
        self._last_timestamp = now
        return result

    def _remember_ids_locked(self, flagged: list[pa.RecordBatch], now: int) -> None:
        """Enter the producer ids of just-written batches (offset, id columns) in the window."""
        if self._dedup is None:
            return
        for part in flagged:
            base = part.column(0)[0].as_py()
            self._dedup.remember(now, part.column(1).to_pylist(),
                                 list(range(base, base + part.num_rows)))

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
                raise
            self._synced_seq = target

    def needs_sync(self) -> bool:
        return self._synced_seq < self._written_seq

    def flush(self) -> None:
        """fsync everything written so far."""
        self._sync_through(self._written_seq)

    @contextmanager
    def _disk_full_as_error(self, action: str) -> Iterator[None]:
        """Report a write that ran out of space as DiskFullError naming this stream.

        The segment list undid the write (all or nothing), so nothing of it
        is stored and the log takes writes again once space is freed. Only
        when even the undo failed is the log ``failed``: then the OSError
        stays, since a restart is needed (docs/broker.md, "Disk full").
        """
        try:
            yield
        except OSError as exc:
            if is_disk_full(exc) and not self.failed:
                raise DiskFullError(self.name, action, exc) from exc
            raise

    def _fail(self, exc: OSError) -> None:
        if self._failure is None:
            self._failure = exc
            log.error("stream %s: disk error, the log refuses writes until it is reopened: %s",
                      self.name, exc)

    # ------------------------------------------------------------------ reads

    def read(self, offset: int, *, max_messages: int = DEFAULT_FETCH_MESSAGES,
             max_bytes: int = DEFAULT_FETCH_BYTES,
             end_offset: int | None = None, latest: bool = False) -> ReadResult:
        """Stored batches from ``offset``; OffsetOutOfRangeError outside [start, end].

        ``latest``: a typed stream's batches all in its current schema version
        (older ones decoded and converted, value_schema.conform_batch; the
        others are the stored bytes), that version in ``schema_version``.
        """
        self._check_readable()
        view = self._view
        try:
            result = read_stored_batches(view, self._cache, self.name, offset,
                                         max_messages=max_messages, max_bytes=max_bytes,
                                         end_offset=end_offset)
        except FileNotFoundError:  # retention deleted the segment under the read
            view = self._view
            raise OffsetOutOfRangeError(self.name, offset, view.start, view.end) from None
        if latest and view.schemas.typed:
            return _conformed(result, view.schemas)
        return result

    def recent_rows(self, offset: int) -> pa.RecordBatch | list[StoredRow] | None:
        """Rows [offset, end) if the last write holds them all, else None.

        For readers that follow the tail: what the last write built, kept with
        the current view (LogView.recent), so the rows a wake-up announced need
        no file read and no decoding: its stored batch (sliced from offset), or
        for a lone message a list with its one row as Python values. None when
        that write was too large to keep, when offset is outside it, or after a
        change that was not a write (truncation, prebuilt appends): the caller
        reads the file then.
        """
        self._check_readable()
        view = self._view  # one read: the rows and the offsets belong together
        recent = view.recent
        if recent is None:
            return None
        if isinstance(recent, StoredRow):
            return [recent] if offset == recent.offset == view.end - 1 >= view.start else None
        first = view.end - recent.num_rows
        if offset < max(first, view.start) or offset >= view.end:
            return None
        if view.schemas.typed:  # in the current version, as read(latest=True) gives
            target = view.schemas.stored_schema(view.schemas.current)
            if not recent.schema.equals(target):
                recent = conform_batch(recent, target)
        return recent if offset == first else recent.slice(offset - first)

    def locate(self, offset: int, *, max_messages: int = DEFAULT_FETCH_MESSAGES,
               end_offset: int | None = None) -> tuple[list[FileSpan], int]:
        """File spans holding [offset, stop) and stop, for same-host readers (reader.py)."""
        self._check_readable()
        return locate_range(self._view, self.name, offset, max_messages=max_messages,
                            end_offset=end_offset)

    def read_table(self, offset: int, end_offset: int) -> pa.Table:
        """Messages [offset, end_offset) (up to the end of the log) as one table.

        A typed stream's in its current schema version (read(latest=True)).
        """
        batches: list[pa.RecordBatch] = []
        position = offset
        schema = self._schemas.stored_schema(self._schemas.current)
        while position < end_offset:
            result = self.read(position, max_messages=end_offset - position,
                               max_bytes=_READ_TABLE_BYTES, end_offset=end_offset, latest=True)
            if result.count == 0:
                break
            schema = self._schemas.stored_schema(result.schema_version)
            batches.extend(decode_payload(payload, schema) for payload in result.batches)
            position = result.next_offset
        return pa.Table.from_batches(batches, schema=schema)

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """True as soon as end_offset > offset (woken by appends), False on timeout."""
        with self._state:
            self._state.wait_for(
                lambda: self._view.end > offset or self._closed is not None, timeout_s
            )
            return self._view.end > offset

    def add_append_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every change of the view (appends, deletions).

        It runs in the writing thread, under the append lock, right after the
        data became visible: a waiter woken by it reacts without the hand-off
        through a watcher thread that ``wait_for_data`` would need (shared
        groups wait on their own condition). It must be quick, must not raise
        and must never wait for anything that holds this log's append lock.
        """
        with self._listeners_lock:
            self._listeners = (*self._listeners, listener)

    def remove_append_listener(self, listener: Callable[[], None]) -> None:
        with self._listeners_lock:
            self._listeners = tuple(x for x in self._listeners if x != listener)

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """First offset with timestamp >= ``timestamp_ms``; end_offset if none."""
        self._check_readable()
        return offset_for_timestamp(self._view, self._cache, timestamp_ms)

    def timestamp_at(self, offset: int) -> int:
        """Append time (epoch ms) of the message at ``offset``; 0 when none is stored there.

        A group's lag in seconds is the age of its oldest unconsumed message:
        usually the frame header answers, a frame of mixed times is decoded.
        """
        self._check_readable()
        view = self._view
        if not view.start <= offset < view.end:
            return 0
        return timestamp_at(view, self._cache, offset)

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
            segments = self._segments.segments
            doomed = 0
            while segments[doomed].next_offset <= offset:
                doomed += 1
            self._delete_head_locked(doomed, f"delete_before({offset})")

    def delete_all(self) -> None:
        """Make start_offset = end_offset; later appends continue from the same end offset."""
        with self._append_lock:
            self._check_usable()
            self._delete_all_locked("delete_all")

    def _delete_all_locked(self, reason: str) -> None:
        tail = self._segments.tail
        if tail is None:
            return
        if not tail.is_empty:
            self._segments.roll(reason)
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
        doomed = self._segments.detach_head(count)
        start = max(self._view.start, self._segments.segments[0].base_offset)
        self._publish_view_locked(start=start)
        if self._dedup is not None:
            self._dedup.forget_below(start)
        self._segments.delete_files(doomed)
        log.info("stream %s: %s deleted %d segment(s) with offsets [%d, %d) (%d bytes); "
                 "start offset is %d", self.name, reason, count, doomed[0].base_offset,
                 doomed[-1].next_offset, sum(segment.size for segment in doomed), start,
                 extra=event_fields(stream=self.name, start_offset=start,
                                    count=doomed[-1].next_offset - doomed[0].base_offset))

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
            self._segments.truncate(view, offset)
            if self._dedup is not None:
                self._dedup.forget_from(offset)
            self._publish_view_locked()
            log.info("stream %s: truncated to offset %d (%d messages removed)",
                     self.name, offset, view.end - offset,
                     extra=event_fields(stream=self.name, end_offset=offset))

    # ------------------------------------------------------------------ retention, config

    def apply_retention(self, now_ms: int) -> int:
        """Delete the segments retention no longer keeps; returns how many were deleted."""
        with self._append_lock:
            if self._closed is not None or self._failure is not None or not len(self._segments):
                return 0
            plan = plan_retention(self._segments.segments, self._config, now_ms,
                                  self._view.start)
            before = len(self._segments)
            if plan.expire_tail:
                self._delete_all_locked(f"retention ({plan.reason})")
                return before
            self._delete_head_locked(plan.delete_count, f"retention ({plan.reason})")
            return plan.delete_count

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
            raise OSError(errno.EIO, f"stream '{self.name}' refuses writes after a disk error "
                          f"({self._failure}); restart the broker to recover it")


def _conformed(result: ReadResult, schemas: ValueSchemas) -> ReadResult:
    """``result`` with every batch in the current schema version (see StreamLog.read)."""
    current = schemas.current
    batches = result.batches
    if any(version != current for version in result.versions):
        target = schemas.stored_schema(current)
        batches = [
            data if version == current else conform_batch(
                decode_payload(data, schemas.stored_schema(version)), target
            ).serialize().to_pybytes()
            for data, version in zip(result.batches, result.versions, strict=True)
        ]
    return replace(result, batches=batches, versions=(current,) * len(batches),
                   schema_version=current)

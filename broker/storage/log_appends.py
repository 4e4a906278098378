"""The append path of a StreamLog: checks, group commit, framing and writing at the tail.

Every append is prepared (checked and completed: ids, sizes, a typed stream's
values converted) in the caller's thread, queued, and written by the
group-commit leader for all queued ones (group_commit.py) under the append
lock: one stored batch per group, a lone small message from its template
(small_append.py), prebuilt frames and staged files stamped in place
(append_prebuilt). ``append`` with AckMode.FSYNC returns after the covering
fsync; the others rely on the flusher.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import accumulate, groupby
from typing import TypeVar, cast

import numpy as np
import pyarrow as pa

from npstream.broker.errors import (
    InvalidArgumentError,
    ValueMismatchError,
)
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
from npstream.broker.storage.group_commit import CommitRequest
from npstream.broker.storage.log_state import LogState, Payload
from npstream.broker.storage.prebuilt import PrebuiltFrame
from npstream.broker.storage.results import AppendResult, StoredRow
from npstream.broker.storage.segment_list import UndoFailedError
from npstream.broker.storage.settings import AckMode
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

__all__ = ["AppendPath"]

log = logging.getLogger(__name__)


_T = TypeVar("_T")
_Payload = Payload

# A written batch up to this size stays in memory with the view it made (LogView.recent)
# until the next write: tail readers take it from there instead of reading the file
# back. Bounded so that an idle stream holds at most this much.
RECENT_MAX_BYTES = 1 << 20


class AppendPath(LogState):
    """StreamLog's appends (log.py); the fields are LogState's."""

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

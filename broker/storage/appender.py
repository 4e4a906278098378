"""The appender of one stream's log: one entry point, group commit, framing at the tail.

Every append goes through ``Appender.append``: a publish's rows (a table, or
Python values for the lean small-append path) are prepared in the caller's
thread (checked and completed: ids, sizes, a typed stream's values
converted; nothing queued when they do not fit), rows already framed (the
sink's prebuilt frames and staged files, framed_append.py; next, a replica's
frames) are taken as they are. Both are queued on the log's CommitQueue
(group_commit.py), whose leader writes for everyone queued under the append
lock: one stored batch per group of rows, a lone small message from its
template (small_append.py), a FramedAppend alone. AckMode.FSYNC returns
after the covering fsync; with AckMode.WRITE the flusher fsyncs later, or a
pipelined publisher calls ``SegmentStore.sync_through`` with the result's
``write_sequence``.

Timestamps are broker append times: max(clock(), last timestamp), one per
written group, so they never decrease within a stream.
"""

from __future__ import annotations

import itertools
import secrets
import weakref
from collections.abc import Callable
from itertools import groupby
from typing import Any, TypeAlias, TypeVar, cast

import numpy as np
import pyarrow as pa

from npstream.broker.errors import InvalidArgumentError, ValueMismatchError
from npstream.broker.storage.append_plan import (
    PendingAppend,
    PlannedRows,
    plan_append,
    prepare_append,
    typed_values,
)
from npstream.broker.storage.batch_builder import build_message_batch
from npstream.broker.storage.framed_append import FramedAppend, check_versions, write_parts
from npstream.broker.storage.group_commit import CommitQueue, CommitRequest
from npstream.broker.storage.results import AppendResult, StoredRow
from npstream.broker.storage.segment_store import SegmentStore
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
from npstream.broker.storage.staged_segment import check_sizes
from npstream.broker.storage.tuning import RECENT_MAX_BYTES

__all__ = ["RECENT_MAX_BYTES", "AppendData", "Appender", "new_id_prefix"]

# Broker-filled message ids are <16 hex digits of the log instance><offset>. Each log
# opened gets the next value of a random 64-bit start, instead of 8 bytes of
# os.urandom per open (~100 us here: a million streams reopened after eviction).
# Two processes collide only if their random starts fall within as many opens.
_ID_PREFIXES = itertools.count(secrets.randbits(64))


def new_id_prefix() -> str:
    """A fresh prefix of broker-filled ids (the module comment above)."""
    return f"{next(_ID_PREFIXES) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


# What an append takes: rows to prepare (normalize_publish_table output, or Python
# values), or rows already framed.
AppendData: TypeAlias = pa.Table | MessageRows | FramedAppend
# What the commit queue carries: an append's checked rows, one small message on the lean
# path, or framed rows (written alone).
_Payload: TypeAlias = PendingAppend | LoneMessage | FramedAppend
_T = TypeVar("_T")
_R = TypeVar("_R")


class Appender:
    """Appends to one log (module docstring); thread-safe."""

    __slots__ = ("__weakref__", "_id_prefix", "_id_prefix_text", "_on_dirty", "_queue",
                 "_store")

    def __init__(self, store: SegmentStore,
                 on_dirty: Callable[[Any], None] | None = None) -> None:
        self._store = store
        self._on_dirty = on_dirty
        self._id_prefix_text = new_id_prefix()
        self._id_prefix = self._id_prefix_text.encode()
        # Weak references to its own methods: no reference cycle, so an evicted log
        # (open_logs.py) is freed as soon as its last user drops it, not at a later
        # garbage collection of every object in the broker.
        self._queue: CommitQueue[_Payload] = CommitQueue(
            store.settings.max_batch_bytes, _weakly(self._write_group), store.sync_through)

    # ------------------------------------------------------------------ the entry point

    def append(self, data: AppendData, ack: AckMode = AckMode.FSYNC) -> AppendResult:
        """Store ``data``; its AppendResult once written (and fsynced for AckMode.FSYNC).

        Rows are checked before anything is queued (MessageTooLargeError,
        ValueMismatchError: nothing stored); see the module docstring.
        """
        store = self._store
        store.check_usable()
        fsync = ack is AckMode.FSYNC
        request: CommitRequest[_Payload]
        if isinstance(data, FramedAppend):
            request = CommitRequest(data, 0, fsync=fsync, atomic=True)
            return self._submit(request)
        pending = self.prepare(data)
        if isinstance(pending, LoneMessage):
            request = CommitRequest(pending, len(pending.value), fsync=fsync)
            return self._submit(request)
        if pending.table.num_rows == 0:
            return AppendResult(store.view.end, 0, [],
                                max(store.clock(), store.last_timestamp), store.written_seq)
        request = CommitRequest(pending, pending.table.get_total_buffer_size(), fsync=fsync)
        return self._submit(request)

    def _submit(self, request: CommitRequest[_Payload]) -> AppendResult:
        """Queue ``request`` for group commit; its AppendResult once written (and synced)."""
        # The queue is generic over results (``object``); this appender's writer,
        # _write_group, sets every request's result to an AppendResult.
        return cast(AppendResult, self._queue.submit(request))

    def prepare(self, data: pa.Table | MessageRows) -> PendingAppend | LoneMessage:
        """Checked, completed rows of an append, from a table or from Python values."""
        store = self._store
        config = store.config
        if store.typed:
            table = rows_table(data) if isinstance(data, MessageRows) else data
            return self._prepare_table(table, find_repeats=config.dedup_window_ms > 0)
        if isinstance(data, MessageRows):
            lone = lone_message(data, store.name, config.max_message_bytes)
            if lone is not None:
                return lone
            return prepare_rows(data, store.name, config.max_message_bytes,
                                find_repeats=config.dedup_window_ms > 0)
        return self._prepare_table(data, find_repeats=config.dedup_window_ms > 0)

    def _prepare_table(self, data: pa.Table, *, find_repeats: bool) -> PendingAppend:
        """prepare_append for this stream: its values converted first when it is typed."""
        store = self._store
        schemas = store.schemas
        limit = store.config.max_message_bytes
        if not schemas.typed:
            if pa.types.is_struct(data.schema.field("value").type):
                raise InvalidArgumentError(
                    f"publish to stream '{store.name}': the value is a struct, but the stream "
                    "has no value schema (untyped streams store bytes); send bytes, or give "
                    "the stream a schema (docs/typed-streams.md)")
            return prepare_append(data, store.name, limit, find_repeats=find_repeats)
        version = schemas.current
        table, typed = typed_values(data, store.name, version, schemas.values[version],
                                    schemas.stored_schema(version))
        return prepare_append(table, store.name, limit, find_repeats=find_repeats,
                              typed=typed)

    # ------------------------------------------------------------------ the leader's write

    def _write_group(self, group: list[CommitRequest[_Payload]]) -> int:
        """Leader: plan, frame and write one group; returns its write sequence number."""
        store = self._store
        framed = group[0].payload
        if isinstance(framed, FramedAppend):  # an atomic request: always alone
            with store.lock:
                sequence = self._write_framed_locked(group[0], framed)
        else:
            with store.lock, store.disk_errors("append"):
                sequence = self._write_group_locked(group)
        if sequence and self._on_dirty is not None and not all(r.fsync for r in group):
            self._on_dirty(store)
        return sequence or store.written_seq

    def _write_framed_locked(self, request: CommitRequest[_Payload],
                             framed: FramedAppend) -> int:
        """Write a FramedAppend (framed_append.py); its write sequence, 0 if it was empty."""
        store = self._store
        store.check_usable()
        parts = framed.parts
        check_versions(parts, store.name, store.schemas)
        check_sizes(parts, store.name, store.config.max_message_bytes,
                    store.schemas.stored_schema)
        now = max(store.clock() if framed.timestamp is None else framed.timestamp,
                  store.last_timestamp)
        first = store.view.end
        if framed.expect_first is not None and first != framed.expect_first:
            raise ValueError(f"stream '{store.name}' ends at offset {first}, "
                             f"not {framed.expect_first}")
        if framed.before_write is not None:
            framed.before_write(first, now)
        count = framed.count
        if not count:
            request.result = AppendResult(first, 0, [], now, store.written_seq)
            return 0
        with store.disk_errors("append"):
            flagged = write_parts(store, parts, first, now)
        self._remember_ids_locked(flagged, now)
        store.written_seq += 1
        request.result = AppendResult(first, count, [], now, store.written_seq)
        store.publish_view()
        return store.written_seq

    def _write_group_locked(self, group: list[CommitRequest[_Payload]]) -> int:
        """The group's write sequence number; 0 when nothing was written (all duplicates)."""
        store = self._store
        store.check_usable()
        now = max(store.clock(), store.last_timestamp)
        window = store.dedup
        if window is not None:
            window.expire(now)
        first = store.view.end
        sequence = store.written_seq + 1  # if anything is written
        recent: pa.RecordBatch | StoredRow | None
        if store.typed:
            group = self._typed_members_locked(group)
            if not group:
                return 0
        if len(group) == 1 and isinstance(group[0].payload, LoneMessage):
            group[0].result = AppendResult(first, 1, [], now, sequence)
            recent = self._write_lone_locked(group[0].payload.value, first, now)
        else:
            next_offset = first
            pending_ids: dict[str, int] | None = {} if len(group) > 1 else None
            planned: list[PlannedRows] = []
            members: list[tuple[CommitRequest[_Payload], int, PlannedRows]] = []
            for request in group:
                payload = request.payload
                if isinstance(payload, LoneMessage):  # written with others: as rows
                    payload = request.payload = payload.pending()
                assert isinstance(payload, PendingAppend), "framed appends go alone"
                rows = plan_append(payload, next_offset, window, pending_ids)
                members.append((request, next_offset, rows))
                next_offset += rows.table.num_rows
                if rows.table.num_rows:
                    planned.append(rows)
            # All duplicates: no write of their own, durable once what is written is.
            written = sequence if planned else store.written_seq
            for request, offset, rows in members:
                request.result = AppendResult(offset, rows.table.num_rows, rows.duplicates,
                                              now, written)
            if not planned:
                return 0
            batch = self._write_rows_locked(planned, first, now)
            recent = (batch if batch is not None and batch.get_total_buffer_size()
                      <= RECENT_MAX_BYTES else None)
        store.written_seq = sequence
        store.publish_view(recent=recent)
        return sequence

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
            if isinstance(payload, LoneMessage) or (isinstance(payload, PendingAppend)
                                                    and not payload.schema_version):
                request.error = ValueMismatchError(
                    f"publish to stream '{self._store.name}': the stream became typed (value "
                    f"schema version {self._store.schemas.current}) while this publish was "
                    "queued as untyped bytes; nothing of it was stored: publish it again")
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
        files = self._store.files
        self._store.write_at_tail(first, now,
                                  lambda: files.write_payload(payload, first, 1, now))
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
        store = self._store
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
                                        store.schemas.stored_schema(version))
        else:
            batch = build_stored_batch(table, first, now, self._id_prefix)
        files = store.files
        flagged = store.write_at_tail(
            first, now, lambda: files.write_batch(batch, supplied, now, version))
        self._remember_ids_locked(flagged, now)
        return batch

    def _remember_ids_locked(self, flagged: list[pa.RecordBatch], now: int) -> None:
        """Enter the producer ids of just-written batches (offset, id columns) in the window."""
        window = self._store.dedup
        if window is None:
            return
        for part in flagged:
            base = part.column(0)[0].as_py()
            window.remember(now, part.column(1).to_pylist(),
                            list(range(base, base + part.num_rows)))


def _weakly(method: Callable[[_T], _R]) -> Callable[[_T], _R]:
    """``method`` (bound) called through a weak reference to its object."""
    ref = weakref.WeakMethod(method)

    def call(argument: _T) -> _R:
        bound = ref()
        if bound is None:  # only a caller holding the log calls it
            raise ReferenceError("the stream log is gone")
        return bound(argument)

    return call

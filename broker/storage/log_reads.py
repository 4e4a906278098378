"""The read path of a StreamLog: reads over the current view, tail waits, time lookups.

Readers take no lock: they use the current ``LogView`` (reader.py), which
every change replaces, so a read sees one consistent set of segments and
offsets even while appends, retention or deletions run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import pyarrow as pa

from npstream.broker.errors import OffsetOutOfRangeError
from npstream.broker.storage.log_state import LogState
from npstream.broker.storage.reader import (
    FileSpan,
    locate_range,
    offset_for_timestamp,
    read_stored_batches,
    timestamp_at,
)
from npstream.broker.storage.results import LogStats, ReadResult, StoredRow
from npstream.broker.storage.value_schemas import ValueSchemas
from npstream.proto.defaults import DEFAULT_FETCH_BYTES, DEFAULT_FETCH_MESSAGES
from npstream.proto.frames.payload import decode_payload
from npstream.proto.value_schema import conform_batch

__all__ = ["ReadPath"]

log = logging.getLogger(__name__)


_READ_TABLE_BYTES = 8 << 20  # per read() of read_table: bounds the buffer, no slower


class ReadPath(LogState):
    """StreamLog's reads (log.py); the fields are LogState's."""

    # ------------------------------------------------------------------ reads

    def read(self, offset: int, *, max_messages: int = DEFAULT_FETCH_MESSAGES,
             max_bytes: int = DEFAULT_FETCH_BYTES,
             end_offset: int | None = None, latest: bool = False,
             whole: bool = False) -> ReadResult:
        """Stored batches from ``offset``; OffsetOutOfRangeError outside [start, end].

        ``latest``: a typed stream's batches all in its current schema version
        (older ones decoded and converted, value_schema.conform_batch; the
        others are the stored bytes), that version in ``schema_version``.
        ``whole``: stored batches uncut (reader.read_stored_batches).
        """
        self._check_readable()
        view = self._view
        try:
            result = read_stored_batches(view, self._cache, self.name, offset,
                                         max_messages=max_messages, max_bytes=max_bytes,
                                         end_offset=end_offset, whole=whole)
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


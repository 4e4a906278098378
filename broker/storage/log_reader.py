"""The readers of one stream's log: reads over the current view, recent rows, time lookups.

Readers take no lock: each call takes the segment store's current ``LogView``
(reader.py) once and works on it, so a read sees one consistent set of
segments and offsets even while appends, retention or deletions run; every
change publishes a new view instead of changing the one a reader holds.
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa

from npstream.broker.errors import OffsetOutOfRangeError
from npstream.broker.storage.reader import (
    FileSpan,
    locate_range,
    offset_for_timestamp,
    read_stored_batches,
    timestamp_at,
)
from npstream.broker.storage.results import LogStats, ReadResult, StoredRow
from npstream.broker.storage.segment_store import SegmentStore
from npstream.broker.storage.tuning import READ_TABLE_BYTES
from npstream.broker.storage.value_schemas import ValueSchemas
from npstream.proto.defaults import DEFAULT_FETCH_BYTES, DEFAULT_FETCH_MESSAGES
from npstream.proto.frames.payload import decode_payload
from npstream.proto.value_schema import conform_batch

__all__ = ["LogReader"]



class LogReader:
    """Reads of one log (module docstring); thread-safe."""

    __slots__ = ("_first_timestamp", "_store")

    def __init__(self, store: SegmentStore) -> None:
        self._store = store
        self._first_timestamp: tuple[int, int] = (-1, 0)  # (start offset, its timestamp)

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
        store = self._store
        store.check_readable()
        view = store.view
        try:
            result = read_stored_batches(view, store.cache, store.name, offset,
                                         max_messages=max_messages, max_bytes=max_bytes,
                                         end_offset=end_offset, whole=whole)
        except FileNotFoundError:  # retention deleted the segment under the read
            view = store.view
            raise OffsetOutOfRangeError(store.name, offset, view.start, view.end) from None
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
        change that was not a write (truncation, framed appends): the caller
        reads the file then.
        """
        self._store.check_readable()
        view = self._store.view  # one read: the rows and the offsets belong together
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
        store = self._store
        store.check_readable()
        return locate_range(store.view, store.name, offset, max_messages=max_messages,
                            end_offset=end_offset)

    def read_table(self, offset: int, end_offset: int) -> pa.Table:
        """Messages [offset, end_offset) (up to the end of the log) as one table.

        A typed stream's in its current schema version (read(latest=True)).
        """
        batches: list[pa.RecordBatch] = []
        position = offset
        schemas = self._store.schemas
        schema = schemas.stored_schema(schemas.current)
        while position < end_offset:
            result = self.read(position, max_messages=end_offset - position,
                               max_bytes=READ_TABLE_BYTES, end_offset=end_offset, latest=True)
            if result.count == 0:
                break
            schema = schemas.stored_schema(result.schema_version)
            batches.extend(decode_payload(payload, schema) for payload in result.batches)
            position = result.next_offset
        return pa.Table.from_batches(batches, schema=schema)

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """First offset with timestamp >= ``timestamp_ms``; end_offset if none."""
        store = self._store
        store.check_readable()
        return offset_for_timestamp(store.view, store.cache, timestamp_ms)

    def timestamp_at(self, offset: int) -> int:
        """Append time (epoch ms) of the message at ``offset``; 0 when none is stored there.

        A group's lag in seconds is the age of its oldest unconsumed message:
        usually the frame header answers, a frame of mixed times is decoded.
        """
        store = self._store
        store.check_readable()
        view = store.view
        if not view.start <= offset < view.end:
            return 0
        return timestamp_at(view, store.cache, offset)

    def stats(self) -> LogStats:
        view = self._store.view
        if not view.segments:
            return LogStats(view.start, view.end, 0, 0, 0, 0)
        size = sum(segment.size for segment in view.segments[:-1]) + view.tail_size
        first = last = 0
        if view.start < view.end:
            cached_start, cached = self._first_timestamp
            if cached_start != view.start:
                cached = timestamp_at(view, self._store.cache, view.start)
                self._first_timestamp = (view.start, cached)
            first = cached
            last = max(s.max_timestamp for s in view.segments[-2:])
        return LogStats(view.start, view.end, size, first, last, len(view.segments))


def _conformed(result: ReadResult, schemas: ValueSchemas) -> ReadResult:
    """``result`` with every batch in the current schema version (see LogReader.read)."""
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

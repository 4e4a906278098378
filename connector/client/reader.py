"""The reading part of ``npstream.Client``: fetches, exact range reads, offset lookups.

Kept apart because reading is where the client chooses a path for the bytes:
on the broker's machine the stored frames are read straight from its segment
files (``npstream.client.local_reads``, after one Locate call), elsewhere one
Fetch or one server-streaming ReadRange call. Either way the broker's stored
record batches are decoded without per-row work and only trimmed at the
range edges, so the choice never shows in the result.

A typed stream's batches have ``value`` as a struct of its latest schema
version's fields: the broker sends them in that version with its stored
schema (FetchResponse.stored_schema), and local reads convert older frames
the same way (local_reads.FrameSchemas).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

import pyarrow as pa

from npstream.client.checks import (
    checked_int,
    checked_offset,
    checked_stream,
    checked_wait_ms,
    parsed,
)
from npstream.client.connection import Connection
from npstream.client.core import ClientCore
from npstream.client.local_reads import (
    LocalReadUnavailable,
    LocalSpans,
    check_same_host,
    iter_local,
)
from npstream.errors import InvalidArgument, OffsetOutOfRange
from npstream.proto import pb
from npstream.proto.defaults import DEFAULT_FETCH_BYTES, DEFAULT_FETCH_MESSAGES
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.proto.units import parse_timestamp_ms

__all__ = ["DEFAULT_FETCH_BYTES", "DEFAULT_FETCH_MESSAGES", "Reader"]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- tuning
# Defaults of fetch() (DEFAULT_FETCH_MESSAGES, DEFAULT_FETCH_BYTES) are the
# contract's, npstream.proto.defaults: 0 on the wire means the same, but
# explicit values make the docs and the code agree.
MAX_INT32 = (1 << 31) - 1  # FetchRequest.max_messages is an int32


@functools.lru_cache(maxsize=64)
def _stored_schema(data: bytes) -> pa.Schema:
    """FetchResponse.stored_schema: a plain Arrow IPC schema message (the whole batch schema)."""
    return pa.ipc.read_schema(pa.py_buffer(data))


def _response_schema(response: pb.FetchResponse) -> pa.Schema:
    """The schema of a response's batches: MESSAGE_SCHEMA, or a typed stream's stored one."""
    return _stored_schema(response.stored_schema) if response.stored_schema else MESSAGE_SCHEMA


def _decode_batches(batches: Iterable[bytes],
                    schema: pa.Schema = MESSAGE_SCHEMA) -> list[pa.RecordBatch]:
    return [pa.ipc.read_record_batch(pa.py_buffer(data), schema) for data in batches]


def _trim(batch: pa.RecordBatch, start: int, end: int | None) -> pa.RecordBatch:
    """Cut a batch to [start, end) by its (dense) offsets; O(1) unless it must cut."""
    if batch.num_rows == 0:
        return batch
    offsets = batch.column(0)
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    if first >= start and (end is None or last < end):
        return batch
    lo = max(start - first, 0)
    hi = batch.num_rows if end is None else min(end - first, batch.num_rows)
    return batch.slice(lo, max(hi - lo, 0))


class Reader(ClientCore):
    """Reading methods of ``Client`` (docs/client.md, "Reading")."""

    def _fetch(
        self,
        stream: str,
        offset: int,
        max_messages: int,
        max_bytes: int,
        wait: float,
        end_offset: int | None,
    ) -> pb.FetchResponse:
        if max_messages <= 0 or max_bytes <= 0:
            raise InvalidArgument(
                f"max_messages and max_bytes must be > 0, got {max_messages} and {max_bytes}"
            )
        request = pb.FetchRequest(
            stream=checked_stream(stream),
            offset=checked_offset("offset", offset),
            max_messages=checked_int("max_messages", max_messages, "FetchRequest.max_messages"),
            max_bytes=checked_int("max_bytes", max_bytes, "FetchRequest.max_bytes"),
            wait_ms=checked_wait_ms("wait", wait, "FetchRequest.wait_ms"),
            end_offset=0 if end_offset is None else checked_offset(
                "end_offset", end_offset, "FetchRequest.end_offset"),
        )
        return self.call(lambda s: s.StreamService.Fetch, request, timeout=self.timeout + wait)

    def fetch_batches(
        self,
        stream: str,
        offset: int,
        *,
        end_offset: int | None = None,
        max_messages: int = DEFAULT_FETCH_MESSAGES,
        max_bytes: int = DEFAULT_FETCH_BYTES,
        wait: float = 0.0,
    ) -> tuple[list[pa.RecordBatch], int]:
        """Messages from ``offset`` (up to ``end_offset``, exclusive) as record batches.

        Returns ``(batches, next_offset)``. ``wait`` > 0 long-polls when
        ``offset`` is the end of the stream. The batches are decoded from the
        broker's bytes without per-row work; a typed stream's have ``value`` as
        a struct of its latest schema's fields.
        """
        batches, next_offset, _schema = self._fetch_decoded(
            stream, offset, end_offset, max_messages, max_bytes, wait)
        return batches, next_offset

    def _fetch_decoded(
        self, stream: str, offset: int, end_offset: int | None, max_messages: int,
        max_bytes: int, wait: float,
    ) -> tuple[list[pa.RecordBatch], int, pa.Schema | None]:
        """fetch_batches plus the schema of the batches (None when nothing was asked)."""
        if end_offset is not None and checked_offset("end_offset", end_offset) <= offset:
            return [], offset, None
        response = self._fetch(stream, offset, max_messages, max_bytes, wait, end_offset)
        schema = _response_schema(response)
        batches = [
            _trim(batch, offset, end_offset)
            for batch in _decode_batches(response.batches, schema)
        ]
        return [b for b in batches if b.num_rows], max(response.next_offset, offset), schema

    def fetch(
        self,
        stream: str,
        offset: int,
        max_messages: int = DEFAULT_FETCH_MESSAGES,
        max_bytes: int = DEFAULT_FETCH_BYTES,
        wait: float = 0.0,
        end_offset: int | None = None,
    ) -> pa.Table:
        """Like ``fetch_batches`` but one Table (empty when nothing).

        MESSAGE_SCHEMA, or for a typed stream the same envelope with ``value``
        a struct of its latest schema's fields.
        """
        batches, _, schema = self._fetch_decoded(
            stream, offset, end_offset, max_messages, max_bytes, wait)
        if schema is None:  # an empty range: nothing was fetched
            schema = batches[0].schema if batches else MESSAGE_SCHEMA
        # from_batches, not Schema.empty_table(): the latter imports pandas (~0.5 s).
        return pa.Table.from_batches(batches, schema=schema)

    def read_batches(
        self,
        stream: str,
        offset: int,
        *,
        end_offset: int | None = None,
        max_messages: int = DEFAULT_FETCH_MESSAGES,
        max_bytes: int = DEFAULT_FETCH_BYTES,
    ) -> tuple[list[pa.RecordBatch], int]:
        """Like ``fetch_batches`` without a long poll, reading the broker's files when local.

        On the broker's machine the stored frames are read from its segment
        files (local reads, docs/client.md), else this is one Fetch. Errors
        are Fetch's: OffsetOutOfRange, StreamNotFound.
        """
        if end_offset is not None and checked_offset("end_offset", end_offset) <= offset:
            return [], offset
        if self._local_reads:
            located = self._locate(stream, offset, end_offset, max_messages)
            if located is not None:
                batches: list[pa.RecordBatch] = []
                position, total = offset, 0
                try:
                    for batch, after, size in iter_local(located):
                        batches.append(batch)
                        position = after
                        total += size
                        if total >= max_bytes:
                            break
                    return batches, position
                except LocalReadUnavailable as exc:
                    self._local_read_failed(stream, exc)
                    if batches:
                        return batches, position
        return self.fetch_batches(stream, offset, end_offset=end_offset,
                                  max_messages=max_messages, max_bytes=max_bytes)

    def _locate(self, stream: str, offset: int, end_offset: int | None,
                max_messages: int) -> LocalSpans | None:
        """Where [offset, end) is stored, or None when this client cannot read it locally."""
        request = pb.FetchRequest(
            stream=checked_stream(stream), offset=checked_offset("offset", offset),
            max_messages=min(max_messages, MAX_INT32),
            end_offset=0 if end_offset is None else checked_offset(
                "end_offset", end_offset, "FetchRequest.end_offset"),
        )
        response = self.call(lambda s: s.StreamReadService.Locate, request)
        try:
            check_same_host(response)
        except LocalReadUnavailable as exc:
            self._local_read_failed(stream, exc)
            return None
        return LocalSpans(response, offset)

    def _local_read_failed(self, stream: str, exc: LocalReadUnavailable) -> None:
        if exc.permanent:
            self._local_reads = False
            log.info("local reads from %s are off for this client: %s", self.address, exc)
        else:
            log.debug("local read of stream '%s' fell back to gRPC: %s", stream, exc)

    def read_range(
        self, stream: str, start: int, end: int, *, max_bytes: int = DEFAULT_FETCH_BYTES
    ) -> Iterator[pa.RecordBatch]:
        """Every message in ``[start, end)``, as record batches, read as fast as the broker allows.

        Local reads when the broker runs on this machine, else one
        server-streaming ReadRange call; ``max_bytes`` bounds each step.
        Raises OffsetOutOfRange when ``start`` is below the stream's
        start_offset (retention removed it) or ``end`` is beyond its end_offset.
        """
        offset = checked_offset("start", start)
        if checked_offset("end", end) < offset:
            raise InvalidArgument(f"read_range: end {end} is before start {start}")
        while offset < end and self._local_reads:
            located = self._locate(stream, offset, end, end - offset)
            if located is None:
                break
            if located.next_offset <= offset:
                self._range_not_written(stream, start, end, located.response)
            try:
                for batch, after, _size in iter_local(located):
                    offset = after
                    yield batch
            except LocalReadUnavailable as exc:
                self._local_read_failed(stream, exc)
                break
        if offset >= end:
            return
        request = pb.FetchRequest(stream=checked_stream(stream), offset=offset, max_bytes=max_bytes,
                                  end_offset=end)
        response = None
        for response in self._read_range_call(request):
            for batch in _decode_batches(response.batches, _response_schema(response)):
                batch = _trim(batch, offset, end)
                if batch.num_rows:
                    yield batch
            offset = max(offset, response.next_offset)
        if offset < end:
            self._range_not_written(stream, start, end, response)

    def _read_range_call(self, request: pb.FetchRequest) -> Iterator[pb.FetchResponse]:
        """The replies of one ReadRange call, sent to the broker holding the stream.

        A redirect comes before any reply (the broker routes the request
        first), so following it resends nothing that was read.
        """
        def first_reply(conn: Connection) -> tuple[pb.FetchResponse | None, Iterator[Any]]:
            call = conn.server_stream(lambda s: s.StreamReadService.ReadRange, request,
                                      timeout=None)
            return next(call, None), call

        first, rest = self._brokers.routed(request.stream, first_reply)
        if first is not None:
            yield first
            yield from rest

    @staticmethod
    def _range_not_written(stream: str, start: int, end: int,
                           response: pb.FetchResponse | pb.LocateResponse | None) -> NoReturn:
        first = response.start_offset if response is not None else -1
        last = response.end_offset if response is not None else -1
        raise OffsetOutOfRange(
            f"range [{start}, {end}) of stream '{stream}' is not fully written: "
            f"start_offset={first}, end_offset={last}",
            stream=stream, offset=end, start_offset=first, end_offset=last,
        )

    def offset_for_timestamp(self, stream: str, ts: dt.datetime | str | int) -> int:
        """First offset appended at or after ``ts`` (datetime, ISO-8601, epoch ms); else end."""
        request = pb.OffsetForTimestampRequest(
            stream=checked_stream(stream), timestamp_ms=parsed(parse_timestamp_ms, "ts", ts)
        )
        return int(self.call(lambda s: s.StreamService.OffsetForTimestamp, request).offset)

    def end_offsets(
        self, streams: Iterable[str] | None = None, pattern: str | None = None
    ) -> dict[str, tuple[int, int]]:
        """``{stream: (start_offset, end_offset)}`` in one RPC; no arguments means every stream."""
        names = [checked_stream(name) for name in streams] if streams is not None else []
        if streams is None and pattern is None:
            pattern = "*"
        response = self.call(lambda s: s.StreamService.EndOffsets,
                             pb.EndOffsetsRequest(streams=names, pattern=pattern or ""))
        return {s.stream: (s.start_offset, s.end_offset) for s in response.streams}

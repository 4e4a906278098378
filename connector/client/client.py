"""``npstream.Client``: the Python SDK over the broker's gRPC API.

The client is a thin, typed layer: names and config values are checked here
so that mistakes fail before a round trip, message data travels as Arrow
(publish_batch sends Arrow IPC streams, fetches decode the broker's stored
record-batch messages without touching rows), and every transport concern
(auth, TLS, retries) lives in ``npstream.client.connection``.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
import pyarrow as pa
import pyarrow.compute as pc

from npstream.client.batching import (
    encode_ipc_stream,
    encode_publish_request,
    iter_slices,
    row_sizes,
    split_rows,
)
from npstream.client.connection import Connection, StreamingCall
from npstream.client.local_reads import (
    LocalReadUnavailable,
    LocalSpans,
    check_same_host,
    iter_local,
)
from npstream.client.models import BatchPublishResult, PublishResult, RepairResult, StreamInfo
from npstream.client.publishing import NotSent, PublishTally, RequestPlan, pipelined
from npstream.client.values import encode_headers, encode_key, encode_value, messages_to_table
from npstream.errors import BrokerUnavailable, InvalidArgument, NpstreamError, OffsetOutOfRange
from npstream.proto import pb
from npstream.proto.names import validate_stream_name
from npstream.proto.schema import MESSAGE_SCHEMA, normalize_publish_table
from npstream.proto.units import parse_duration_ms, parse_size, parse_timestamp_ms

if TYPE_CHECKING:
    from npstream.groups.cursor import Consumer
    from npstream.groups.shared import Lease, Subscription
    from npstream.sink.client import SinkClient

__all__ = ["Client"]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- tuning
# Page size for ListStreams (the broker's maximum is 10000).
LIST_PAGE_SIZE = 1000
# Defaults of fetch(); 0 on the wire would mean the same, but explicit values
# make the docs and the code agree.
DEFAULT_FETCH_MESSAGES = 10_000
DEFAULT_FETCH_BYTES = 8 << 20
MAX_INT32 = (1 << 31) - 1  # FetchRequest.max_messages is an int32

_ACKS = {"fsync": pb.ACK_FSYNC, "write": pb.ACK_WRITE}

Duration = float | int | dt.timedelta | str
Size = int | str


def _stream(name: object) -> str:
    try:
        return validate_stream_name(name)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def _ack(ack: str) -> int:
    try:
        return _ACKS[ack]
    except (KeyError, TypeError):
        raise InvalidArgument(f"invalid ack {ack!r}: use 'fsync' or 'write'") from None


def _parsed(parser: Callable[[object], int], parameter: str, value: object) -> int:
    try:
        return parser(value)
    except ValueError as exc:
        raise InvalidArgument(f"{parameter}: {exc}") from None


def _config(
    max_age: Duration | None,
    max_bytes: Size | None,
    dedup_window: Duration | None,
    max_message_bytes: Size | None,
) -> pb.StreamConfig:
    """A wire StreamConfig with only the given fields set (absent = broker default)."""
    config = pb.StreamConfig()
    if max_age is not None:
        config.max_age_ms = _parsed(parse_duration_ms, "max_age", max_age)
    if max_bytes is not None:
        config.max_bytes = _parsed(parse_size, "max_bytes", max_bytes)
    if dedup_window is not None:
        config.dedup_window_ms = _parsed(parse_duration_ms, "dedup_window", dedup_window)
    if max_message_bytes is not None:
        config.max_message_bytes = _parsed(parse_size, "max_message_bytes", max_message_bytes)
    return config


def _offset(parameter: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"{parameter} must be an offset (int >= 0), got {value!r}")
    return value


def _decode_batches(batches: Iterable[bytes]) -> list[pa.RecordBatch]:
    return [pa.ipc.read_record_batch(pa.py_buffer(data), MESSAGE_SCHEMA) for data in batches]


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


_NOTHING = object()  # an empty iterable of messages


def _publish_table(data: pa.Table | pa.RecordBatch) -> pa.Table:
    try:
        return normalize_publish_table(data)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def _all_have_ids(table: pa.Table) -> bool:
    """True when every row carries a non-empty id: the broker's dedup makes a resend safe."""
    if "id" not in table.column_names:
        return False
    ids = table.column("id")
    return ids.null_count == 0 and bool(pc.all(pc.greater(pc.binary_length(ids), 0)).as_py())


class Client:
    """A connection to one npstream broker.

    Thread-safe: one client may be shared by many threads (gRPC channels are).
    Use it as a context manager or call ``close()``.
    """

    def __init__(
        self,
        address: str | None = None,
        token: str | None = None,
        *,
        tls: bool = False,
        root_certificates: bytes | None = None,
        timeout: float = 30.0,
        retry_deadline: float = 15.0,
        local_reads: bool = True,
    ) -> None:
        self._conn = Connection(
            address,
            token,
            tls=tls,
            root_certificates=root_certificates,
            timeout=timeout,
            retry_deadline=retry_deadline,
        )
        self.address = self._conn.address
        self.timeout = self._conn.timeout
        # Read stored frames from the broker's files when it runs on this
        # machine (npstream.client.local_reads); switched off for good at the first
        # sign that it cannot work here.
        self._local_reads = local_reads

    # ------------------------------------------------------------ plumbing

    def call(
        self, rpc: str, request: Any, *, timeout: float | None = None, idempotent: bool = True
    ) -> Any:
        """Send a unary RPC such as ``"StreamService.Fetch"`` (auth, retries, error mapping)."""
        return self._conn.call(rpc, request, timeout=timeout, idempotent=idempotent)

    def call_serialized(
        self, rpc: str, request: bytes, response_type: Any, *,
        timeout: float | None = None, idempotent: bool = True,
    ) -> Any:
        """``call`` with a request already in protobuf wire bytes (npstream.proto.wire builds them).

        Saves copying a big bytes field into a message and out again; the
        reply is a ``response_type`` message.
        """
        return self._conn.call_serialized(rpc, request, response_type, timeout=timeout,
                                          idempotent=idempotent)

    def stream(
        self, rpc: str, request_iterator: Iterable[Any], *, timeout: float | None = None
    ) -> StreamingCall:
        """Open a bidirectional streaming RPC (``"GroupService.Subscribe"``); not retried."""
        return self._conn.stream(rpc, request_iterator, timeout=timeout)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(address={self.address!r})"

    # ------------------------------------------------------------ streams

    def create_stream(
        self,
        name: str,
        max_age: Duration | None = None,
        max_bytes: Size | None = None,
        dedup_window: Duration | None = None,
        max_message_bytes: Size | None = None,
        exist_ok: bool = False,
    ) -> StreamInfo:
        request = pb.CreateStreamRequest(
            name=_stream(name),
            config=_config(max_age, max_bytes, dedup_window, max_message_bytes),
            exist_ok=exist_ok,
        )
        info = StreamInfo.from_pb(self.call("StreamService.CreateStream", request))
        log.info("created stream '%s' (or it existed): %s", info.name, info.config)
        return info

    def stream_info(self, name: str) -> StreamInfo:
        request = pb.DescribeStreamRequest(name=_stream(name))
        return StreamInfo.from_pb(self.call("StreamService.DescribeStream", request))

    def list_streams(
        self, prefix: str | None = None, pattern: str | None = None
    ) -> list[StreamInfo]:
        """Every stream matching ``prefix`` and/or the glob ``pattern``, sorted by the broker."""
        streams: list[StreamInfo] = []
        token = ""
        while True:
            response = self.call(
                "StreamService.ListStreams",
                pb.ListStreamsRequest(
                    prefix=prefix or "", pattern=pattern or "", page_size=LIST_PAGE_SIZE,
                    page_token=token,
                ),
            )
            streams.extend(StreamInfo.from_pb(info) for info in response.streams)
            token = response.next_page_token
            if not token:
                return streams

    def update_stream(
        self,
        name: str,
        max_age: Duration | None = None,
        max_bytes: Size | None = None,
        dedup_window: Duration | None = None,
        max_message_bytes: Size | None = None,
    ) -> StreamInfo:
        """Change only the given settings (0 = unlimited/off); None leaves one as it is."""
        request = pb.UpdateStreamRequest(
            name=_stream(name), config=_config(max_age, max_bytes, dedup_window, max_message_bytes)
        )
        info = StreamInfo.from_pb(self.call("StreamService.UpdateStream", request))
        log.info("updated stream '%s': %s", info.name, info.config)
        return info

    def delete_stream(self, name: str) -> bool:
        request = pb.DeleteStreamRequest(name=_stream(name))
        response = self.call("StreamService.DeleteStream", request)
        log.info("deleted stream '%s': %s", name, response.deleted)
        return bool(response.deleted)

    def delete_messages(self, name: str, before_offset: int | None = None) -> StreamInfo:
        """Drop messages below ``before_offset`` (it becomes start_offset), or all when None."""
        request = pb.DeleteMessagesRequest(name=_stream(name))
        if before_offset is not None:
            request.before_offset = _offset("before_offset", before_offset)
        info = StreamInfo.from_pb(self.call("StreamService.DeleteMessages", request))
        log.info("deleted messages of stream '%s' before offset %s: now [%d, %d)",
                 name, "end" if before_offset is None else before_offset,
                 info.start_offset, info.end_offset)
        return info

    def repair_stream(self, name: str) -> RepairResult:
        request = pb.RepairStreamRequest(name=_stream(name))
        response = self.call("StreamService.RepairStream", request)
        result = RepairResult.from_pb(response)
        log.warning("repaired stream '%s': truncated %d bytes at %s",
                    name, result.truncated_bytes, result.detail)
        return result

    # ------------------------------------------------------------ publish

    def publish(
        self,
        stream: str,
        value: object,
        id: str | None = None,
        key: bytes | str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        ack: str = "fsync",
    ) -> PublishResult:
        """Append one message; with an ``id`` a resend within the dedup window is a no-op."""
        if id is not None and not isinstance(id, str):
            raise InvalidArgument(f"id must be str, got {type(id).__name__}: {id!r}")
        message = pb.Message(
            id=id or "", value=encode_value(value), headers=encode_headers(headers)
        )
        encoded_key = encode_key(key)
        if encoded_key is not None:
            message.key = encoded_key
        request = pb.PublishRequest(stream=_stream(stream), messages=[message], ack=_ack(ack))
        response = self.call("StreamService.Publish", request, idempotent=bool(id))
        if response.duplicates:
            return PublishResult(offset=response.duplicates[0].offset, duplicate=True)
        return PublishResult(offset=response.first_offset, duplicate=False)

    def publish_batch(
        self,
        stream: str,
        messages: (Sequence[Mapping[str, Any]] | pa.Table | pa.RecordBatch
                   | Iterable[pa.Table | pa.RecordBatch]),
        ack: str = "fsync",
    ) -> BatchPublishResult:
        """Append many messages in order, as Arrow IPC requests of about 4 MiB each.

        ``messages`` is a list of dicts (keys value/id/key/headers), a pyarrow
        Table/RecordBatch with PUBLISH_COLUMNS (value required), or an iterable
        of such tables (e.g. a generator or ``ParquetFile.iter_batches()``):
        all of them are published in order on one PublishStream call, each
        table read from the iterator only when the requests before it are on
        the wire, so memory stays bounded and building the next table
        overlaps sending the previous ones. A table of
        several requests goes on one PublishStream call with up to
        PUBLISH_WINDOW requests in flight (their fsyncs overlap); offsets still
        follow the input order. Nothing of a request is stored when the broker
        rejects it (e.g. an oversized message); earlier requests stay stored,
        later ones are not stored, and the raised error carries a note saying
        how many rows were stored.
        """
        name = _stream(stream)
        ack_mode = _ack(ack)
        if isinstance(messages, (pa.Table, pa.RecordBatch)):
            table = _publish_table(messages)
        else:
            items = iter(messages)
            first = next(items, _NOTHING)
            if first is _NOTHING:
                table = messages_to_table([])
            elif not isinstance(first, (pa.Table, pa.RecordBatch)):
                table = messages_to_table([first, *items])  # dicts, in a list or any iterable
            else:
                return self._publish_tables(name, itertools.chain([first], items), ack_mode)
        if table.num_rows == 0:
            return BatchPublishResult(first_offset=-1, stored_count=0, duplicates=[], offsets=[])
        safe_to_resend = _all_have_ids(table)
        ranges = split_rows(row_sizes(table))
        tally = PublishTally()
        try:
            if len(ranges) > 1:
                self._publish_pipelined(name, table, ranges, ack_mode, safe_to_resend, tally)
            else:
                self._publish_one_by_one(name, table, ranges, ack_mode, safe_to_resend, tally)
        except NpstreamError as exc:
            tally.note_failure(exc)
            raise
        log.debug("published %d message(s) to '%s' in %d request(s): %d stored, %d duplicate(s)",
                  table.num_rows, name, len(ranges), tally.stored, len(tally.duplicates))
        return tally.result()

    def _publish_tables(
        self, name: str, tables: Iterator[pa.Table | pa.RecordBatch], ack_mode: int
    ) -> BatchPublishResult:
        """An iterator of tables as one stream of requests (see publish_batch).

        The tables are built by the caller's iterator while earlier requests
        are in flight. No fallback to unary calls: the input cannot be rewound.
        """

        def prepare(item: object) -> tuple[pa.Table, list[tuple[int, int]]]:
            if not isinstance(item, (pa.Table, pa.RecordBatch)):
                raise InvalidArgument("publish_batch iterates pyarrow Tables or RecordBatches, "
                                      f"got {type(item).__name__}")
            table = _publish_table(item)
            return table, split_rows(row_sizes(table)) if table.num_rows else []

        plan = RequestPlan(tables, prepare,
                           lambda part: encode_publish_request(name, ack_mode, part))
        tally = PublishTally()
        try:
            for index, response in enumerate(pipelined(
                functools.partial(self._open_publish_stream, timeout=None),
                iter(plan),
            )):
                start, stop = plan.ranges[index]
                tally.add(start, stop - start, response)
            if plan.error is not None:
                raise plan.error
        except NpstreamError as exc:
            if exc.code == grpc.StatusCode.UNIMPLEMENTED and not tally.rows_done:
                # An older broker: nothing was stored, and the tables already taken
                # from the caller's iterator cannot be given back for unary calls.
                raise NpstreamError(
                    f"the broker at {self.address} has no StreamService.PublishStream (it "
                    "predates it), which publish_batch needs for an iterator of tables; "
                    "nothing was stored: pass one Table (sent with unary calls) or upgrade "
                    "the broker", code=exc.code) from exc
            tally.note_failure(exc)
            raise
        except Exception as exc:  # the caller's iterator failed
            tally.note_failure(exc)
            raise
        log.debug("published %d message(s) to '%s' in %d request(s) from an iterator",
                  tally.rows_done, name, len(plan.ranges))
        return tally.result()

    def _open_publish_stream(self, requests: Iterable[bytes], *,
                             timeout: float | None) -> StreamingCall:
        """A PublishStream call sending ``requests`` (PublishRequest wire bytes)."""
        return self._conn.stream_serialized("StreamService.PublishStream", requests,
                                            pb.PublishResponse, timeout=timeout)

    def _publish_one_by_one(
        self, name: str, table: pa.Table, ranges: list[tuple[int, int]], ack_mode: int,
        safe_to_resend: bool, tally: PublishTally,
    ) -> None:
        """Unary Publish per request, each after the previous one's reply (and retried)."""
        for (start, _stop), part in zip(ranges, iter_slices(table, ranges), strict=True):
            request = pb.PublishRequest(
                stream=name, arrow_stream=encode_ipc_stream(part), ack=ack_mode
            )
            response = self.call("StreamService.Publish", request, idempotent=safe_to_resend)
            tally.add(start, part.num_rows, response)

    def _publish_pipelined(
        self, name: str, table: pa.Table, ranges: list[tuple[int, int]], ack_mode: int,
        safe_to_resend: bool, tally: PublishTally,
    ) -> None:
        """All requests on one PublishStream call, several in flight (publish_pipeline.py).

        Falls back to one unary call at a time from the first request without
        a reply when the broker has no PublishStream (UNIMPLEMENTED), and when
        the stream broke (UNAVAILABLE) where a unary retry would be allowed:
        every row has an id, or the call never reached the broker.
        """
        requests = (encode_publish_request(name, ack_mode, part)
                    for part in iter_slices(table, ranges))
        done = 0
        try:
            for response in pipelined(
                functools.partial(self._open_publish_stream,
                                  timeout=self.timeout * len(ranges)),
                requests,
            ):
                start, stop = ranges[done]
                tally.add(start, stop - start, response)
                done += 1
        except NpstreamError as exc:
            unimplemented = exc.code == grpc.StatusCode.UNIMPLEMENTED
            retryable = isinstance(exc, NotSent) or (
                isinstance(exc, BrokerUnavailable) and safe_to_resend
            )
            if not (unimplemented or retryable):
                raise
            log.debug("publish stream to '%s' failed after %d of %d request(s) (%s); "
                      "sending the rest one at a time", name, done, len(ranges), exc)
            self._publish_one_by_one(name, table, ranges[done:], ack_mode, safe_to_resend,
                                     tally)

    # ------------------------------------------------------------ fetch

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
        if wait < 0:
            raise InvalidArgument(f"wait must be >= 0 seconds, got {wait!r}")
        request = pb.FetchRequest(
            stream=_stream(stream),
            offset=_offset("offset", offset),
            max_messages=max_messages,
            max_bytes=max_bytes,
            wait_ms=int(wait * 1000),
            end_offset=0 if end_offset is None else end_offset,
        )
        return self.call("StreamService.Fetch", request, timeout=self.timeout + wait)

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
        broker's bytes without per-row work.
        """
        if end_offset is not None and _offset("end_offset", end_offset) <= offset:
            return [], offset
        response = self._fetch(stream, offset, max_messages, max_bytes, wait, end_offset)
        batches = [
            _trim(batch, offset, end_offset) for batch in _decode_batches(response.batches)
        ]
        return [b for b in batches if b.num_rows], max(response.next_offset, offset)

    def fetch(
        self,
        stream: str,
        offset: int,
        max_messages: int = DEFAULT_FETCH_MESSAGES,
        max_bytes: int = DEFAULT_FETCH_BYTES,
        wait: float = 0.0,
        end_offset: int | None = None,
    ) -> pa.Table:
        """Like ``fetch_batches`` but one Table (MESSAGE_SCHEMA; empty when nothing)."""
        batches, _ = self.fetch_batches(
            stream, offset, end_offset=end_offset, max_messages=max_messages,
            max_bytes=max_bytes, wait=wait,
        )
        # from_batches, not Schema.empty_table(): the latter imports pandas (~0.5 s).
        return pa.Table.from_batches(batches, schema=MESSAGE_SCHEMA)

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
        if end_offset is not None and _offset("end_offset", end_offset) <= offset:
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
            stream=_stream(stream), offset=_offset("offset", offset),
            max_messages=min(max_messages, MAX_INT32),
            end_offset=0 if end_offset is None else end_offset,
        )
        response = self.call("StreamReadService.Locate", request)
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
        offset = _offset("start", start)
        if _offset("end", end) < offset:
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
        request = pb.FetchRequest(stream=_stream(stream), offset=offset, max_bytes=max_bytes,
                                  end_offset=end)
        response = None
        for response in self._conn.server_stream("StreamReadService.ReadRange", request,
                                                  timeout=None):
            for batch in _decode_batches(response.batches):
                batch = _trim(batch, offset, end)
                if batch.num_rows:
                    yield batch
            offset = max(offset, response.next_offset)
        if offset < end:
            self._range_not_written(stream, start, end, response)

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
            stream=_stream(stream), timestamp_ms=_parsed(parse_timestamp_ms, "ts", ts)
        )
        return int(self.call("StreamService.OffsetForTimestamp", request).offset)

    def end_offsets(
        self, streams: Iterable[str] | None = None, pattern: str | None = None
    ) -> dict[str, tuple[int, int]]:
        """``{stream: (start_offset, end_offset)}`` in one RPC; no arguments means every stream."""
        names = [_stream(name) for name in streams] if streams is not None else []
        if streams is None and pattern is None:
            pattern = "*"
        response = self.call(
            "StreamService.EndOffsets", pb.EndOffsetsRequest(streams=names, pattern=pattern or "")
        )
        return {s.stream: (s.start_offset, s.end_offset) for s in response.streams}

    # ------------------------------------------------------------ groups and sink

    def consumer(self, stream: str, group: str, start_from: object = "earliest") -> Consumer:
        from npstream.groups.cursor import Consumer

        return Consumer(self, stream, group, start_from=start_from)

    def subscribe(
        self,
        stream: str,
        group: str,
        handler: Callable[[Lease], object],
        *,
        ack_wait: float = 30.0,
        max_in_flight: int = 100,
        max_deliver: int = 0,
        backoff: Sequence[float] | None = None,
        dead_letter_stream: str | None = None,
        member_id: str | None = None,
    ) -> Subscription:
        from npstream.groups.shared import subscribe

        return subscribe(
            self, stream, group, handler, ack_wait=ack_wait, max_in_flight=max_in_flight,
            max_deliver=max_deliver, backoff=backoff, dead_letter_stream=dead_letter_stream,
            member_id=member_id,
        )

    def receive(
        self,
        stream: str,
        group: str,
        max: int = 10,
        *,
        wait: float = 0.0,
        ack_wait: float = 30.0,
        max_deliver: int = 0,
        backoff: Sequence[float] | None = None,
        dead_letter_stream: str | None = None,
        member_id: str | None = None,
    ) -> list[Lease]:
        from npstream.groups.shared import receive

        return receive(
            self, stream, group, max, wait=wait, ack_wait=ack_wait, max_deliver=max_deliver,
            backoff=backoff, dead_letter_stream=dead_letter_stream, member_id=member_id,
        )

    def list_groups(self, stream: str) -> Any:
        from npstream.groups.admin import list_groups

        return list_groups(self, stream)

    def describe_group(self, stream: str, group: str) -> Any:
        from npstream.groups.admin import describe_group

        return describe_group(self, stream, group)

    def delete_group(self, stream: str, group: str) -> Any:
        from npstream.groups.admin import delete_group

        return delete_group(self, stream, group)

    def sink(self, *, local_staging: bool = True) -> SinkClient:
        """A SinkClient (exactly-once staging/commit) sharing this connection.

        ``local_staging``: on the broker's machine, Stage hands its data over
        in a file of the broker's stage inbox; False: always over gRPC.
        """
        from npstream.sink.client import SinkClient

        return SinkClient(self, local_staging=local_staging)

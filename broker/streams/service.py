"""StreamService: the gRPC face of the stream registry and the logs.

Each method validates its request, calls the registry or a StreamLog, and
builds the reply; errors are typed BrokerErrors mapped by rpc/status.py. Message
data stays columnar: Publish turns the request into one Arrow table (the
``messages`` field of simple clients is converted column by column), and
Fetch returns the stored Arrow IPC batches as they are.

Typed streams (docs/typed-streams.md): both publish paths reach the log,
which converts the values (a struct column, or JSON objects in bytes) to the
stream's schema; Fetch returns every batch in the current schema version
(older versions' batches converted by the log) with that version's stored
schema in ``stored_schema``.

Access control: each method asks ``ctx.access.require`` for the right it
needs on its stream (docs/broker.md "Security" has the table) before doing
anything else; ListStreams and EndOffsets' pattern return only the streams
the caller may read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from typing import TypeVar

import grpc
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError

from npstream.broker.auth.access import Right
from npstream.broker.errors import (
    CorruptRecordError,
    InvalidArgumentError,
    StreamNeedsRepairError,
    StreamNotFoundError,
)
from npstream.broker.faults import PublishFault
from npstream.broker.rpc.arrow_input import decode_arrow_stream
from npstream.broker.rpc.registration import add_service, check_ranges
from npstream.broker.rpc.status import rpc_method
from npstream.broker.server.context import BrokerContext
from npstream.broker.storage import AckMode, AppendResult, ReadResult, StreamLog
from npstream.broker.storage.small_append import MessageRows
from npstream.broker.streams.names import check_stream_name
from npstream.broker.streams.publish_many import serve_publish_many
from npstream.broker.streams.publish_stream import serve_publish_stream
from npstream.broker.streams.records import SchemaVersion, StreamStatus
from npstream.broker.streams.registry import StreamRegistry
from npstream.broker.streams.tuning import LONG_POLL_SLICE_S
from npstream.proto import pb, pb_grpc
from npstream.proto.defaults import DEFAULT_FETCH_BYTES, DEFAULT_FETCH_MESSAGES
from npstream.proto.schema import normalize_publish_table
from npstream.proto.stream_config import STREAM_CONFIG_FIELDS
from npstream.proto.wire import split_bytes_field

__all__ = [
    "StreamServicer",
    "add_to_server",
    "check_fetch_request",
    "on_log",
    "stream_info",
]

log = logging.getLogger(__name__)


T = TypeVar("T")


def value_schemas_pb(schemas: Iterable[SchemaVersion]) -> list[pb.ValueSchema]:
    """A typed stream's schema versions as sent (StreamInfo, LocateResponse), oldest first."""
    return [pb.ValueSchema(version=v.version, ddl=v.ddl, arrow_schema=v.arrow_schema,
                           created_ms=v.created_ms) for v in schemas]


def stream_info(status: StreamStatus) -> pb.StreamInfo:
    info = pb.StreamInfo(name=status.name, config=status.config.to_pb(),
                         created_ms=status.created_ms,
                         error=status.error,
                         value_schemas=value_schemas_pb(status.schemas))
    if status.stats is not None:
        stats = status.stats
        info.start_offset = stats.start_offset
        info.end_offset = stats.end_offset
        info.message_count = stats.end_offset - stats.start_offset
        info.bytes_on_disk = stats.bytes_on_disk
        info.first_timestamp_ms = stats.first_timestamp_ms
        info.last_timestamp_ms = stats.last_timestamp_ms
        info.segment_count = stats.segment_count
    return info


def fetch_response(stream_log: StreamLog, result: ReadResult,
                   batches: Sequence[bytes] = ()) -> pb.FetchResponse:
    """A FetchResponse for ``result`` (Fetch, and each ReadRange reply), batches optional.

    ReadRange joins the stored batches in after encoding (npstream.proto.wire),
    so it passes none here. ``stored_schema`` is the schema a typed read's
    batches are in (empty for untyped streams).
    """
    stored_schema = (stream_log.value_schemas.stored_ipc[result.schema_version]
                     if result.schema_version else b"")
    return pb.FetchResponse(
        batches=batches,
        next_offset=result.next_offset,
        start_offset=stream_log.start_offset,
        end_offset=stream_log.end_offset,
        count=result.count,
        stored_schema=stored_schema,
        schema_version=result.schema_version,
    )


def _overrides(config: pb.StreamConfig) -> dict[str, int]:
    """Only the fields the caller set (absent = broker default)."""
    return {f: getattr(config, f) for f in STREAM_CONFIG_FIELDS if config.HasField(f)}


def _message_rows(messages: Sequence[pb.Message]) -> MessageRows:
    """The repeated Message of simple clients as lists (storage's lean small-append path)."""
    return MessageRows(
        values=[m.value for m in messages],
        ids=[m.id for m in messages],
        keys=[m.key if m.HasField("key") else None for m in messages],
        headers=[dict(m.headers) if m.headers else None for m in messages],
    )


def _empty_ids_to_null(table: pa.Table) -> pa.Table:
    """An empty id means "assign one", in both the messages and the Arrow path."""
    if "id" not in table.column_names:
        return table
    index = table.column_names.index("id")
    column = table.column(index)
    empty = pc.equal(column, "")
    if not pc.any(empty).as_py():
        return table
    nulls = pa.nulls(len(column), pa.string())
    return table.set_column(index, table.field(index), pc.if_else(empty, nulls, column))


def _split_publish(raw: bytes, method: str) -> tuple[pb.PublishRequest, memoryview | None]:
    """A PublishRequest's small fields, and its Arrow data as a view into ``raw`` (None: unset).

    A request with ``messages`` is parsed whole (split_bytes_field bails out).
    """
    try:
        request, arrow = split_bytes_field(raw, pb.PublishRequest, "arrow_stream",
                                           bail_on="messages")
    except DecodeError as exc:
        raise InvalidArgumentError(f"malformed PublishRequest on {method}: {exc}") from None
    return request, arrow[-1] if arrow else None


def on_log(registry: StreamRegistry, stream: str, action: Callable[[], T]) -> T:
    """Run a log operation; corruption found now marks the stream as needing repair."""
    try:
        return action()
    except CorruptRecordError as exc:
        registry.mark_broken(stream, exc)
        raise StreamNeedsRepairError(stream, exc) from None


def check_fetch_request(request: pb.FetchRequest) -> tuple[str, int | None]:
    """The stream name and end offset (None = none) of a valid FetchRequest."""
    stream = check_stream_name(request.stream)  # its numbers: rpc/registration.check_ranges
    end = request.end_offset or None
    if end is not None and end < request.offset:
        raise InvalidArgumentError(
            f"fetch from stream '{stream}': end_offset={end} is below offset={request.offset}"
        )
    return stream, end


class StreamServicer(pb_grpc.StreamServiceServicer):
    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._registry = ctx.registry
        self._metrics = ctx.metrics
        self._stopping = ctx.stopping
        self._publish_fault = PublishFault.from_env()
        self._access = ctx.access
        self._budget = ctx.publish_budget
        self._request_limit = ctx.config.server.grpc_max_message_bytes
        # The latency histogram's child per ack mode, looked up once (a labels() call per
        # publish was a few us of a one-message publish's CPU).
        self._latency = {ack: self._metrics.publish_latency.labels(ack=ack.value)
                         for ack in AckMode}

    def _on_log(self, stream: str, action: Callable[[], T]) -> T:
        return on_log(self._registry, stream, action)

    # ------------------------------------------------------------ admin

    @rpc_method
    def CreateStream(self, request: pb.CreateStreamRequest,
                     context: grpc.ServicerContext) -> pb.StreamInfo:
        self._access.require(context, request.name, Right.ADMIN)
        status, _created = self._registry.create(
            request.name, _overrides(request.config), exist_ok=request.exist_ok,
            value_schema=request.value_schema,
        )
        return stream_info(status)

    @rpc_method
    def DescribeStream(self, request: pb.DescribeStreamRequest,
                       context: grpc.ServicerContext) -> pb.StreamInfo:
        self._access.require(context, request.name, Right.READ)
        return stream_info(self._registry.describe(request.name))

    @rpc_method
    def ListStreams(self, request: pb.ListStreamsRequest,
                    context: grpc.ServicerContext) -> pb.ListStreamsResponse:
        statuses, token = self._registry.list(
            request.prefix, request.pattern, request.page_size, request.page_token,
            visible=self._access.readable(context) if self._access.enabled else None,
        )
        return pb.ListStreamsResponse(streams=[stream_info(s) for s in statuses],
                                      next_page_token=token)

    @rpc_method
    def UpdateStream(self, request: pb.UpdateStreamRequest,
                     context: grpc.ServicerContext) -> pb.StreamInfo:
        self._access.require(context, request.name, Right.ADMIN)
        return stream_info(self._registry.update(request.name, _overrides(request.config),
                                                 request.value_schema))

    @rpc_method
    def DeleteStream(self, request: pb.DeleteStreamRequest,
                     context: grpc.ServicerContext) -> pb.DeleteStreamResponse:
        self._access.require(context, request.name, Right.ADMIN)
        return pb.DeleteStreamResponse(deleted=self._registry.delete(request.name))

    @rpc_method
    def DeleteMessages(self, request: pb.DeleteMessagesRequest,
                       context: grpc.ServicerContext) -> pb.StreamInfo:
        self._access.require(context, request.name, Right.ADMIN)
        before = request.before_offset if request.HasField("before_offset") else None
        status = self._on_log(request.name,
                              lambda: self._registry.delete_messages(request.name, before))
        return stream_info(status)

    @rpc_method
    def RepairStream(self, request: pb.RepairStreamRequest,
                     context: grpc.ServicerContext) -> pb.RepairStreamResponse:
        self._access.require(context, request.name, Right.ADMIN)
        status, truncated, detail = self._registry.repair(request.name)
        return pb.RepairStreamResponse(stream=stream_info(status), truncated_bytes=truncated,
                                       detail=detail)

    # ------------------------------------------------------------ data

    def _prepare_publish(
        self, request: pb.PublishRequest, context: grpc.ServicerContext,
        arrow_stream: memoryview | None, room: ExitStack, held: int,
    ) -> tuple[str, pa.Table | MessageRows | None, AckMode]:
        """The request's stream, its rows (None when empty) and its ack.

        The caller's write right is checked before any data is decoded.

        Rows sent as ``messages`` (simple clients, one-message publishes) stay
        Python values for the storage's lean path (small_append.py); an
        ``arrow_stream`` becomes a normalized table, decoded within the request
        limit, its decoded bytes held in the publish budget until ``room``
        closes (``held``: the wire bytes the call holds there already).
        """
        stream = check_stream_name(request.stream)
        self._access.require(context, stream, Right.WRITE)
        check_ranges(request)  # a raw request (a PublishMany entry alone when it fails)
        if arrow_stream is None:  # given: split off the wire bytes, not in ``request``
            arrow_stream = memoryview(request.arrow_stream)  # each access copies (upb): once
        if request.messages and arrow_stream:
            raise InvalidArgumentError(
                f"publish to stream '{stream}' sets both messages and arrow_stream; send one"
            )
        ack = AckMode.WRITE if request.ack == pb.ACK_WRITE else AckMode.FSYNC
        if request.messages:
            return stream, _message_rows(request.messages), ack
        raw = decode_arrow_stream(
            arrow_stream, f"arrow_stream for stream '{stream}'", budget=self._budget,
            limit=self._request_limit, held=held, room=room) if arrow_stream else None
        if raw is None or raw.num_rows == 0:
            return stream, None, ack
        try:
            table = _empty_ids_to_null(normalize_publish_table(raw))
        except ValueError as exc:
            raise InvalidArgumentError(f"publish to stream '{stream}': {exc}") from None
        return stream, table, ack

    def _published(self, stream: str, result: AppendResult, rows: pa.Table | MessageRows,
                   ack: AckMode, started: float) -> pb.PublishResponse:
        """Count a stored publish in the metrics and build its reply."""
        self._latency[ack].observe(time.perf_counter() - started)
        nbytes = rows.nbytes if isinstance(rows, pa.Table) else sum(map(len, rows.values))
        self._metrics.publish_requests.inc()
        self._metrics.published_messages.inc(result.stored_count)
        self._metrics.published_bytes.inc(nbytes)
        self._metrics.count_in(stream, result.stored_count, nbytes)
        if result.duplicates:
            self._metrics.duplicate_messages.inc(len(result.duplicates))
        log.debug("published %d message(s) to '%s' at offset %d (%d duplicate(s))",
                  result.stored_count, stream, result.first_offset, len(result.duplicates))
        return pb.PublishResponse(
            first_offset=result.first_offset,
            stored_count=result.stored_count,
            duplicates=[pb.Duplicate(index=i, offset=o) for i, o in result.duplicates],
            timestamp_ms=result.timestamp_ms,
        )

    @rpc_method
    def Publish(self, raw: bytes, context: grpc.ServicerContext) -> pb.PublishResponse:
        """One publish; ``raw`` is the request's wire bytes (add_to_server).

        Admitted against the publish memory budget before it was read
        (rpc/budget.py). Its Arrow data is used in place, as PublishStream's:
        parsing the message would copy it twice, which for a large request was
        most of the memory it took.
        """
        request, arrow = _split_publish(raw, "Publish")
        with ExitStack() as room:  # holds the decoded rows' budget until they are written
            stream, rows, ack = self._prepare_publish(request, context, arrow, room, len(raw))
            first = self._first_publish(stream, rows, ack)
            if first is not None:  # a new stream: its message kept in the nursery (nursery.py)
                return first()
            stream_log = self._registry.get(stream, create_if_missing=True)
            if rows is None:
                return pb.PublishResponse(first_offset=stream_log.end_offset, stored_count=0)
            started = time.perf_counter()
            result = self._on_log(stream, lambda: stream_log.append(rows, ack))
            return self._published(stream, result, rows, ack, started)

    @rpc_method
    def PublishStream(self, request_iterator: Iterator[bytes],
                      context: grpc.ServicerContext) -> Iterator[pb.PublishResponse]:
        yield from serve_publish_stream(request_iterator, context,
                                        lambda raw: self._write_publish(raw, context),
                                        self._stopping)

    @rpc_method
    def PublishMany(self, raw: bytes, context: grpc.ServicerContext) -> pb.PublishManyResponse:
        """Many streams' publishes in one request (publish_many.py); ``raw``: its wire bytes.

        Admitted against the publish memory budget before it was read, like Publish.
        """
        return serve_publish_many(
            raw, context, lambda entry: self._write_request(entry, None, context, len(raw)),
            self._ctx.cluster)

    def _write_publish(self, raw: bytes,
                       context: grpc.ServicerContext) -> Callable[[], pb.PublishResponse]:
        """Write one PublishStream request now; the returned reply waits for its fsync.

        The request arrives as wire bytes: its Arrow data is used in place
        (npstream.proto.wire.split_bytes_field), not copied into a message and out
        again - two copies of every ~4 MiB request saved.

        The request waits for room in the publish memory budget before it is
        decoded (this call's reader then reads no further, so gRPC flow control
        holds the client back) and gives it back once written: what waits for
        the fsync is only the reply.
        """
        self._budget.acquire(
            len(raw), "a PublishStream request", wait_s=None,
            should_stop=lambda: self._stopping.is_set() or not context.is_active())
        try:
            request, arrow = _split_publish(raw, "PublishStream")
            return self._write_request(request, arrow, context, len(raw))
        finally:
            self._budget.release(len(raw))

    def _write_request(self, request: pb.PublishRequest, arrow: memoryview | None,
                       context: grpc.ServicerContext,
                       held: int) -> Callable[[], pb.PublishResponse]:
        """Write one publish request now (a PublishStream request, a PublishMany entry);
        the returned reply waits for its fsync (or its nursery commit). ``held``: the
        call's wire bytes in the publish budget."""
        with ExitStack() as room:  # the decoded rows' budget, until they are written
            stream, rows, ack = self._prepare_publish(request, context, arrow, room, held)
            first = self._first_publish(stream, rows, ack)
            if first is not None:
                self._publish_fault.written()
                return first
            stream_log = self._registry.get(stream, create_if_missing=True)
            if rows is None:
                empty = pb.PublishResponse(first_offset=stream_log.end_offset, stored_count=0)
                return lambda: empty
            started = time.perf_counter()
            # Written now, fsynced in reply(): request k+1 is written while request k waits
            # for its fsync, and one fsync covers every request written meanwhile.
            result = self._on_log(stream, lambda: stream_log.append(rows, AckMode.WRITE))
            self._publish_fault.written()

        def reply() -> pb.PublishResponse:
            if ack is AckMode.FSYNC:
                self._on_log(stream, lambda: stream_log.sync_through(result.write_sequence))
            return self._published(stream, result, rows, ack, started)

        return reply

    def _first_publish(self, stream: str, rows: MessageRows | pa.Table | None, ack: AckMode,
                       ) -> Callable[[], pb.PublishResponse] | None:
        """The reply of a publish that created its stream in the nursery, None if it did not.

        A new stream's lone first message is stored by the nursery writer
        (its transaction is fsynced whatever the ack) while the caller goes
        on; the reply waits for that transaction (Publish at once,
        PublishStream and PublishMany once their other requests are written).
        """
        if not isinstance(rows, MessageRows):
            return None
        started = time.perf_counter()
        first = self._registry.create_by_first_publish(stream, rows)
        if first is None:
            return None
        timestamp, wait = first

        def reply() -> pb.PublishResponse:
            wait()
            return self._published(stream, AppendResult(0, 1, [], timestamp), rows, ack,
                                   started)

        return reply

    def _long_poll(self, stream_log: StreamLog, offset: int, wait_ms: int,
                   context: grpc.ServicerContext) -> None:
        """Wait until data past offset exists, the wait ends, the client leaves or we stop.

        At most ``parked_polls.limit`` polls wait at once (rpc/long_polls.py): past
        it the poll is answered at once with what is there, as when its wait ends.
        It sleeps on one event, set by the log's appends and by the call's end.
        """
        wait_s = min(wait_ms, self._ctx.config.server.max_fetch_wait_ms) / 1000
        remaining = context.time_remaining()
        if remaining is not None:
            wait_s = min(wait_s, max(remaining - 0.05, 0.0))
        deadline = time.monotonic() + wait_s
        with self._ctx.parked_polls.park() as woken:
            if woken is None:
                return
            stream_log.add_append_listener(woken.set)
            try:
                context.add_callback(woken.set)  # the client left, or the call was cancelled
                while not self._stopping.is_set() and context.is_active():
                    left = deadline - time.monotonic()
                    if left <= 0 or stream_log.end_offset > offset:
                        return
                    if not stream_log.failed:  # closed (deleted, moved away, stopping): its
                        stream_log.check_writable()  # error, not a wait until the deadline
                    woken.wait(min(left, LONG_POLL_SLICE_S))
                    woken.clear()
            finally:
                stream_log.remove_append_listener(woken.set)

    @rpc_method
    def Fetch(self, request: pb.FetchRequest, context: grpc.ServicerContext) -> pb.FetchResponse:
        stream, end = check_fetch_request(request)
        self._access.require(context, stream, Right.READ)
        stream_log = self._registry.get(stream)
        if (request.wait_ms > 0 and request.offset == stream_log.end_offset
                and (end is None or end > request.offset)):
            self._long_poll(stream_log, request.offset, request.wait_ms, context)
        started = time.perf_counter()
        max_bytes = min(request.max_bytes or DEFAULT_FETCH_BYTES,
                        self._ctx.config.server.max_message_bytes_limit)
        result = self._on_log(stream, lambda: stream_log.read(
            request.offset,
            max_messages=request.max_messages or DEFAULT_FETCH_MESSAGES,
            max_bytes=max_bytes,
            end_offset=end,
            latest=True,
        ))
        batches = [b if isinstance(b, bytes) else bytes(b) for b in result.batches]
        reply = fetch_response(stream_log, result, batches)
        nbytes = sum(len(b) for b in batches)
        self._metrics.fetch_latency.observe(time.perf_counter() - started)
        self._metrics.fetch_requests.inc()
        self._metrics.fetched_messages.inc(result.count)
        self._metrics.fetched_bytes.inc(nbytes)
        self._metrics.count_out(stream, result.count, nbytes)
        return reply

    @rpc_method
    def OffsetForTimestamp(self, request: pb.OffsetForTimestampRequest,
                           context: grpc.ServicerContext) -> pb.OffsetForTimestampResponse:
        self._access.require(context, check_stream_name(request.stream), Right.READ)
        stream_log = self._registry.get(request.stream)
        offset = self._on_log(request.stream,
                              lambda: stream_log.offset_for_timestamp(request.timestamp_ms))
        return pb.OffsetForTimestampResponse(offset=offset)

    @rpc_method
    def EndOffsets(self, request: pb.EndOffsetsRequest,
                   context: grpc.ServicerContext) -> pb.EndOffsetsResponse:
        self._access.require_all(context, request.streams, Right.READ)
        rows = self._registry.end_offsets(
            list(request.streams), request.pattern,
            visible=self._access.readable(context) if self._access.enabled else None)
        return pb.EndOffsetsResponse(streams=[
            pb.StreamOffsets(stream=name, start_offset=start, end_offset=end)
            for name, start, end in rows
        ])


    @rpc_method
    def StreamStats(self, request: pb.StreamStatsRequest,
                    context: grpc.ServicerContext) -> pb.StreamStatsResponse:
        """Streams as DescribeStream reports them, with their traffic since start (top)."""
        self._access.require_all(context, request.streams, Right.READ)
        visible = self._access.readable(context) if self._access.enabled else None
        names = dict.fromkeys(check_stream_name(name) for name in request.streams)
        for name in names:
            if name not in self._registry:
                raise StreamNotFoundError(name)
        if request.pattern:
            names.update(dict.fromkeys(n for n in self._registry.matching(pattern=request.pattern)
                                       if visible is None or visible(n)))
        reply = pb.StreamStatsResponse(broker_time_ms=int(time.time() * 1000),
                                       broker_start_ms=self._metrics.started_ms)
        for name in sorted(names):
            try:
                status = self._registry.describe(name)
            except StreamNotFoundError:  # deleted meanwhile; only named ones are errors
                continue
            activity = self._metrics.activity(name)
            reply.streams.add(stream=stream_info(status), messages_in=activity.messages_in,
                              bytes_in=activity.bytes_in, messages_out=activity.messages_out,
                              bytes_out=activity.bytes_out)
        return reply


def add_to_server(server: grpc.Server, ctx: BrokerContext) -> None:
    """Register the service; the publish methods take raw requests (_split_publish)."""
    add_service(server, "StreamService", StreamServicer(ctx),
                raw_requests={"Publish", "PublishStream", "PublishMany"})

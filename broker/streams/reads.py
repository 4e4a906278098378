"""StreamReadService: bulk reads - file spans for same-host readers, streamed ranges for the rest.

Fetch answers one request with at most one reply's worth of data, so a replay
of a long range is a loop of round trips through Python gRPC's unary path
(~400 MB/s here). Two faster ways, both reading exactly what Fetch would:

- ``Locate``: the segment-file byte spans holding a range, for a client on this
  machine that reads and CRC-checks the frames itself (local reads, like HDFS
  short-circuit reads). The broker still decides which bytes make up the range
  (only whole, written frames; retention and deletes are the log's), and it
  sends the kernel's boot id and each file's device and inode so that the
  client can prove it opened the same file; it falls back to gRPC otherwise.
- ``ReadRange``: one server-streaming call that keeps reading while the client
  receives, with gRPC flow control bounding what is buffered.

Typed streams: Locate also sends every value schema version (a frame's header
names its version; the client converts older ones), ReadRange sends every
batch in the current version with its stored schema, as Fetch does.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator

import grpc

from npstream.broker.auth.access import Right
from npstream.broker.errors import OffsetOutOfRangeError
from npstream.broker.rpc.registration import add_service
from npstream.broker.rpc.status import rpc_method
from npstream.broker.server.context import BrokerContext
from npstream.broker.streams.service import (
    check_fetch_request,
    fetch_response,
    on_log,
    value_schemas_pb,
)
from npstream.broker.streams.tuning import READ_RANGE_MAX_MESSAGES
from npstream.proto import pb
from npstream.proto.defaults import DEFAULT_FETCH_BYTES, DEFAULT_FETCH_MESSAGES
from npstream.proto.host_identity import boot_id
from npstream.proto.wire import encode_with_bytes

__all__ = ["StreamReadServicer", "add_to_server"]

log = logging.getLogger(__name__)



class StreamReadServicer:
    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._registry = ctx.registry
        self._metrics = ctx.metrics
        self._stopping = ctx.stopping
        self._host_id = boot_id() if ctx.config.server.local_reads else ""
        self._access = ctx.access

    @rpc_method
    def Locate(self, request: pb.FetchRequest,
               context: grpc.ServicerContext) -> pb.LocateResponse:
        stream, end = check_fetch_request(request)
        self._access.require(context, stream, Right.READ)
        stream_log = self._registry.get(stream)
        spans, stop = stream_log.locate(  # also the range checks Fetch makes
            request.offset, max_messages=request.max_messages or DEFAULT_FETCH_MESSAGES,
            end_offset=end,
        )
        reply = pb.LocateResponse(host_id=self._host_id, next_offset=request.offset)
        if self._host_id:
            for span in spans:
                try:
                    stat = os.stat(span.path)
                except FileNotFoundError:  # retention deleted it since the view was taken
                    view_start, view_end = stream_log.start_offset, stream_log.end_offset
                    raise OffsetOutOfRangeError(stream, request.offset, view_start,
                                                view_end) from None
                reply.spans.add(path=str(span.path.resolve()), position=span.position,
                                end_position=span.end_position, device=stat.st_dev,
                                inode=stat.st_ino)
            reply.next_offset = stop
            self._metrics.located_messages.inc(stop - request.offset)
            self._metrics.count_out(stream, stop - request.offset,
                                    sum(span.end_position - span.position for span in spans))
        reply.start_offset = stream_log.start_offset
        reply.end_offset = stream_log.end_offset
        # After the spans: every version of their frames is among these.
        reply.value_schemas.extend(value_schemas_pb(self._registry.schema_versions(stream)))
        return reply

    @rpc_method
    def ReadRange(self, request: pb.FetchRequest,
                  context: grpc.ServicerContext) -> Iterator[bytes]:
        stream, end = check_fetch_request(request)
        self._access.require(context, stream, Right.READ)
        stream_log = self._registry.get(stream)
        stop = stream_log.end_offset if end is None else end
        max_bytes = min(request.max_bytes or DEFAULT_FETCH_BYTES,
                        self._ctx.config.server.max_message_bytes_limit)
        offset = request.offset
        while True:
            result = on_log(self._registry, stream, functools.partial(
                stream_log.read, offset, end_offset=stop, max_bytes=max_bytes,
                max_messages=min(max(stop - offset, 0), READ_RANGE_MAX_MESSAGES), latest=True,
            ))
            nbytes = sum(len(b) for b in result.batches)
            self._metrics.fetched_messages.inc(result.count)
            self._metrics.fetched_bytes.inc(nbytes)
            self._metrics.count_out(stream, result.count, nbytes)
            # The stored batches go into the reply with one copy (npstream.proto.wire).
            yield encode_with_bytes(fetch_response(stream_log, result), "batches",
                                    result.batches)
            offset = result.next_offset
            if result.count == 0 or offset >= stop or self._stopping.is_set():
                return


def add_to_server(server: grpc.Server, ctx: BrokerContext) -> None:
    """Register the service; ReadRange replies are pre-encoded bytes (npstream.proto.wire)."""
    add_service(server, "StreamReadService", StreamReadServicer(ctx),
                raw_responses={"ReadRange"})

"""Routing every call of a cluster member: served here, redirected, or answered cluster-wide.

One gRPC server interceptor, installed only when the broker has members, so
a single broker runs exactly as if there were no cluster and no servicer knows about the
cluster. For each method it decides from the proto's shape:

* per-stream methods (``PER_STREAM``: every call whose request names one
  stream, declared in the proto: npstream.proto.routing) read the stream
  name from the request's wire bytes (npstream.proto.wire.field_bytes, a
  few steps whatever the request's size) and ask the router;
  a stream another member owns ends the call with NOT_OWNER and the owner in
  the trailing metadata before the servicer runs. PublishStream routes each
  request as it is read; Subscribe its opening request.
* ListStreams, EndOffsets, StreamStats are answered for the whole cluster
  (fanout.py).
* everything else is this member's own: the sink's CommitBatch, AbortBatch,
  SinkState, StageInbox (a sink commits on each member it staged on; Stage
  routes its target streams itself, npstream.broker.sink.service), the
  cluster service, health and reflection.

A call another member makes (``x-npstream-cluster-local``) is never routed:
it asks for this member's own part.

Every per-stream call this member serves that may change something is
counted while it runs (for a streaming call: each request, from when it is
handed to the servicer until the servicer asks for the next), so that a
stream move (move.py) can refuse new calls and wait for the running ones
before it copies the stream. Reads are refused during a move too but not
waited for (a long poll could hold a move up for minutes); closing the log
ends them.

``tests/broker/cluster`` checks that every method of the proto is in exactly
one of these groups, so a new RPC cannot skip routing unnoticed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from npstream.broker.cluster.fanout import FANOUT_METHODS, PeerError, fan_out, request_type
from npstream.broker.cluster.router import Cluster
from npstream.broker.errors import BrokerError, InvalidArgumentError
from npstream.broker.rpc.status import abort_with
from npstream.proto import metadata_keys
from npstream.proto.routing import PACKAGE, PER_STREAM_METHODS
from npstream.proto.wire import field_bytes

__all__ = ["MEMBER_METHODS", "PER_STREAM", "STREAMING", "RoutingInterceptor"]

log = logging.getLogger(__name__)

_PACKAGE = f"/{PACKAGE}."

# Per-stream unary (or server-streaming) methods, by the request field naming the
# stream: what npstream.proto declares (``(names_stream)``, npstream.proto.routing),
# the same calls the SDK sends to the stream's member.
PER_STREAM: dict[str, tuple[int, ...]] = {
    path: method.field_numbers for path, method in PER_STREAM_METHODS.items()
    if not method.request_streaming}
# Request-streaming methods: (field path of the stream, route every request or the first).
STREAMING: dict[str, tuple[tuple[int, ...], bool]] = {
    path: (method.field_numbers, method.every_request)
    for path, method in PER_STREAM_METHODS.items() if method.request_streaming}
# Each member's own: never routed (the sink's Stage routes its targets itself, and
# PublishMany each entry: broker/streams/publish_many.py).
MEMBER_METHODS = frozenset(_PACKAGE + name for name in (
    "StreamService/PublishMany", "SinkService/Stage", "SinkService/CommitBatch",
    "SinkService/AbortBatch", "SinkService/SinkState", "SinkService/StageInbox",
    "ClusterService/Owners", "ClusterService/MoveIn",
))
# Not counted as calls on their stream, since a move waits for the counted
# ones: MoveStream (it waits for its own move) and the calls that change
# nothing, which may long-poll (a Fetch waits up to max_fetch_wait).
_UNCOUNTED = frozenset(_PACKAGE + name for name in (
    "ClusterService/MoveStream", "StreamService/DescribeStream", "StreamService/Fetch",
    "StreamService/OffsetForTimestamp", "StreamReadService/Locate",
    "StreamReadService/ReadRange", "GroupService/ListGroups", "GroupService/DescribeGroup",
))
# Of those, the ones that may run while their stream is paused (MoveStream finishes
# the move); the others are refused then like every call.
_PAUSED_OK = frozenset({_PACKAGE + "ClusterService/MoveStream"})


def _stream_of(request: object, path: tuple[int, ...]) -> str:
    """The stream a request names: from its wire bytes, or a parsed message's field."""
    if isinstance(request, Message):
        value: Any = request
        for number in path:
            field = value.DESCRIPTOR.fields_by_number[number]
            value = getattr(value, field.name)
        return value if isinstance(value, str) else ""
    raw: Any = request
    for number in path:
        raw = field_bytes(raw, number) if raw is not None else None
    if raw is None:
        return ""
    try:
        return bytes(raw).decode()
    except UnicodeDecodeError:
        return ""  # the servicer's parser refuses it


def _from_member(details: grpc.HandlerCallDetails) -> bool:
    return any(key == metadata_keys.CLUSTER_LOCAL
               for key, _value in details.invocation_metadata or ())


class RoutingInterceptor(grpc.ServerInterceptor):
    """Wraps each handler as the module docstring says."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or _from_member(handler_call_details):
            return handler
        if method in PER_STREAM:
            return self._per_stream(handler, method)
        if method in STREAMING:
            return self._streaming(handler, method)
        if method in FANOUT_METHODS:
            return self._fan_out(handler, method)
        return handler

    def _route(self, stream: str, context: grpc.ServicerContext, method: str) -> None:
        """Return when this member serves ``stream``; else end the call (redirect/error)."""
        if not stream:
            return
        try:
            self._cluster.route(stream, context, paused_ok=method in _PAUSED_OK)
        except BrokerError as exc:
            abort_with(context, exc, method.rpartition("/")[2])

    def _per_stream(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        inner: Any = handler.unary_stream if handler.response_streaming else handler.unary_unary

        moves = self._cluster.moves
        counted = method not in _UNCOUNTED
        path = PER_STREAM[method]

        def routed(request: object, context: grpc.ServicerContext) -> Any:
            stream = _stream_of(request, path)
            self._route(stream, context, method)
            if not stream or moves is None or not counted:
                return inner(request, context)
            try:
                moves.enter(stream)
            except BrokerError as exc:
                abort_with(context, exc, method.rpartition("/")[2])
            try:
                return inner(request, context)
            finally:
                moves.leave(stream)

        make = (grpc.unary_stream_rpc_method_handler if handler.response_streaming
                else grpc.unary_unary_rpc_method_handler)
        return make(routed, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)

    def _streaming(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        path, every = STREAMING[method]
        inner: Any = (handler.stream_stream if handler.response_streaming
                      else handler.stream_unary)
        cluster = self._cluster

        def checked(requests: Iterator[object],
                    context: grpc.ServicerContext) -> Iterator[object]:
            moves = cluster.moves
            stream = ""
            for index, request in enumerate(requests):
                if every or index == 0:
                    stream = _stream_of(request, path) or stream
                    if stream:
                        cluster.route(stream, context)  # raised where the servicer reads
                if not stream or moves is None:
                    yield request
                    continue
                moves.enter(stream)  # StreamMovingError: a move paused the stream
                try:
                    yield request
                finally:
                    moves.leave(stream)

        def routed(requests: Iterator[object], context: grpc.ServicerContext) -> Any:
            return inner(checked(requests, context), context)

        make = (grpc.stream_stream_rpc_method_handler if handler.response_streaming
                else grpc.stream_unary_rpc_method_handler)
        return make(routed, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)

    def _fan_out(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        inner: Any = handler.unary_unary
        message_type = request_type(method)
        name = method.rpartition("/")[2]

        def merged(request: Any, context: grpc.ServicerContext) -> Any:
            raw = not isinstance(request, Message)
            try:
                parsed: Message = message_type.FromString(bytes(request)) if raw else request
            except DecodeError:
                return inner(request, context)  # the servicer refuses it as usual

            def local(own: Message) -> Message:
                reply: Message = inner(own.SerializeToString() if raw else own, context)
                return reply

            try:
                return fan_out(self._cluster, method, parsed, context, local)
            except PeerError as exc:
                exc.abort(context)
            except (BrokerError, InvalidArgumentError) as exc:
                abort_with(context, exc, name)

        return grpc.unary_unary_rpc_method_handler(
            merged, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)

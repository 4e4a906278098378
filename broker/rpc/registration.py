"""Registering a servicer from the proto's service descriptor, with raw bytes where wanted.

The generated ``add_*Servicer_to_server`` functions fix every method's
(de)serializers. Three hot methods do better with raw bytes: ReadRange replies
are joined in wire format straight from the read buffers, and PublishStream
and SinkService.Stage requests are split so that their Arrow data is never
copied out of the received message (npstream.proto.wire). This registers every
method of a service as the generated code would, except that the named
methods get bytes instead of messages on that side (and methods hidden by the
test hook of broker/faults.py, ``hidden_rpcs``, are not registered at all).

Every other request is parsed here, not by gRPC: gRPC answers a request it
cannot deserialize with INTERNAL ("Exception deserializing request!"), the
status that means a broker bug, while a truncated or corrupt protobuf is the
caller's mistake. Parsed here, it is INVALID_ARGUMENT with its reason, like
every other bad request (found by the fuzzing of tests/broker/rpc). Every
parsed request also has its integer and enum fields checked against
npstream.proto.field_ranges (``check_ranges``; the raw-request methods call it
on the fields they parse), so no servicer sees a value out of range.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from npstream.broker.errors import InvalidArgumentError
from npstream.broker.faults import hidden_rpcs
from npstream.broker.rpc.status import abort_with, stream_of
from npstream.proto import pb
from npstream.proto.field_ranges import violation

__all__ = ["add_service", "check_ranges"]

M = TypeVar("M", bound=Message)

_HANDLER_FACTORIES: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def add_service(server: grpc.Server, service: str, servicer: Any, *,
                raw_requests: Collection[str] = (), raw_responses: Collection[str] = ()) -> None:
    """Serve ``servicer``'s methods of the proto service ``service`` (e.g. "StreamService").

    Methods in ``raw_requests`` receive the request's wire bytes; methods in
    ``raw_responses`` return (or yield) wire bytes.
    """
    descriptor = pb.DESCRIPTOR.services_by_name[service]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    hidden = hidden_rpcs()
    for method in descriptor.methods:
        if f"{service}.{method.name}" in hidden:  # test hook: act as an older broker
            continue
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        make = _HANDLER_FACTORIES[(method.client_streaming, method.server_streaming)]
        behaviour = getattr(servicer, method.name)
        if method.name not in raw_requests:
            behaviour = (_parsing_stream(behaviour, request_type) if method.client_streaming
                         else _parsing(behaviour, request_type))
        handlers[method.name] = make(
            behaviour,
            request_deserializer=None,
            response_serializer=(None if method.name in raw_responses
                                 else response_type.SerializeToString),
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(descriptor.full_name, handlers),))


def check_ranges(request: M) -> M:
    """``request`` when its fields are in range (npstream.proto.field_ranges), else
    InvalidArgumentError naming the field, its value and the accepted range."""
    problem = violation(request)
    if problem is not None:
        stream = stream_of(request)
        raise InvalidArgumentError(f"{problem} (stream '{stream}')" if stream else problem)
    return request


def _parse(request_type: type[Message], raw: bytes) -> Any:
    """``raw`` as a ``request_type`` in range; InvalidArgumentError when it is not one."""
    try:
        request = request_type.FromString(raw)
    except DecodeError as exc:
        raise InvalidArgumentError(
            f"malformed {request_type.__name__}: {exc} (not a valid protobuf message)") from None
    return check_ranges(request)


def _parsing(behaviour: Callable[..., Any], request_type: type[Message]) -> Callable[..., Any]:
    """A unary-request method taking the request's wire bytes (see the module docstring)."""

    def parse_then_call(raw: bytes, context: grpc.ServicerContext) -> Any:
        try:
            request = _parse(request_type, raw)
        except InvalidArgumentError as exc:
            abort_with(context, exc, behaviour.__name__)
        return behaviour(request, context)

    return parse_then_call


def _parsing_stream(behaviour: Callable[..., Any],
                    request_type: type[Message]) -> Callable[..., Any]:
    """A streaming-request method taking wire bytes: each request parsed as it is read.

    A malformed one raises InvalidArgumentError where the servicer reads it,
    which ends the call with that status like any error of the servicer.
    """

    def parse_each(raw_requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
        return behaviour((_parse(request_type, raw) for raw in raw_requests), context)

    return parse_each

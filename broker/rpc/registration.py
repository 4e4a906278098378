"""Registering a servicer from the proto's service descriptor, with raw bytes where wanted.

The generated ``add_*Servicer_to_server`` functions fix every method's
(de)serializers. Three hot methods do better with raw bytes: ReadRange replies
are joined in wire format straight from the read buffers, and PublishStream
and SinkService.Stage requests are split so that their Arrow data is never
copied out of the received message (npstream.proto.wire). This registers every
method of a service as the generated code would, except that the named
methods get bytes instead of messages on that side (and methods hidden by the
test hook of broker/faults.py, ``hidden_rpcs``, are not registered at all).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import grpc

from npstream.broker.faults import hidden_rpcs
from npstream.proto import pb

__all__ = ["add_service"]

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
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=None if method.name in raw_requests else request_type.FromString,
            response_serializer=(None if method.name in raw_responses
                                 else response_type.SerializeToString),
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(descriptor.full_name, handlers),))

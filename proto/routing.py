"""Which RPCs are about one stream, and which request field names it, from npstream.proto.

The ``(names_stream)`` field option in npstream.proto is the one place this
is declared. A cluster of brokers serves a call about one stream on the
member that holds it: the broker's routing interceptor
(npstream.broker.cluster.interceptor) routes exactly the methods listed here
by the field given here, and the SDK (npstream.client.routing) sends the
same calls to the stream's member. Read from the descriptors at import, so
a new RPC whose request marks its stream field is routed on both sides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from npstream.proto import pb

__all__ = ["PACKAGE", "PER_STREAM_METHODS", "STREAM_FIELDS", "StreamMethod", "stream_path"]

PACKAGE = pb.DESCRIPTOR.package  # "npstream.v1"


@dataclass(frozen=True)
class StreamMethod:
    """One RPC about one stream and where its request names the stream."""

    path: str  # the gRPC method path, "/npstream.v1.StreamService/Publish"
    field_names: tuple[str, ...]  # ("stream",), ("open", "stream")
    field_numbers: tuple[int, ...]  # the same path as field numbers, to read wire bytes
    request_streaming: bool
    response_streaming: bool

    @property
    def every_request(self) -> bool:
        """Whether each request of a request-streaming call names its stream.

        True when the stream field is the request's own (PublishStream);
        False when it sits in a sub-message only the first request carries
        (SubscribeRequest.open).
        """
        return len(self.field_numbers) == 1


def _marked(field: FieldDescriptor) -> bool:
    # The generated stubs type the extension as a plain FieldDescriptor.
    return bool(field.GetOptions().Extensions[cast(Any, pb.names_stream)])


def stream_path(message: Descriptor) -> tuple[FieldDescriptor, ...] | None:
    """The marked fields leading from ``message`` to its stream's name (None: unmarked).

    A message marks at most one field; a marked message field leads on
    into that message, and the path must end at a string.
    """
    marked = [field for field in message.fields if _marked(field)]
    if not marked:
        return None
    if len(marked) > 1:
        raise RuntimeError(f"{message.full_name} marks {len(marked)} fields (names_stream) "
                           "in npstream.proto; mark one")
    field = marked[0]
    if field.type == FieldDescriptor.TYPE_STRING and not field.is_repeated:
        return (field,)
    if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
        inner = stream_path(field.message_type)
        if inner is not None:
            return (field, *inner)
    raise RuntimeError(f"{message.full_name}.{field.name} is marked (names_stream) in "
                       "npstream.proto but is neither a string nor a message marking one")


def _read() -> tuple[Mapping[str, StreamMethod], Mapping[type[Any], str]]:
    methods: dict[str, StreamMethod] = {}
    fields: dict[type[Any], str] = {}
    for service in pb.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            path = stream_path(method.input_type)
            if path is None:
                continue
            full = f"/{PACKAGE}.{service.name}/{method.name}"
            methods[full] = StreamMethod(
                full, tuple(f.name for f in path), tuple(f.number for f in path),
                method.client_streaming, method.server_streaming)
            if len(path) == 1:
                fields[getattr(pb, method.input_type.name)] = path[0].name
    return MappingProxyType(methods), MappingProxyType(fields)


# Every method about one stream, by gRPC method path.
# Each request message class that names its stream in a field of its own, and that
# field's name: what the SDK reads to send a call to the stream's member.
PER_STREAM_METHODS, STREAM_FIELDS = _read()

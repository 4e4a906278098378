"""The generated gRPC stubs of one channel, and how a call names its method.

The SDK names each call's method by the generated stub's attribute, as a
function of the stubs: ``lambda s: s.StreamService.Publish`` (an ``Rpc``).
The service and the method are attributes mypy checks, not strings, and the
connection that sends the call (a cluster member: npstream.client.routing)
is chosen before the method is taken from its stubs. The method's name, for
log lines and errors, is read from the proto's descriptors.

``Client.call("StreamService.Fetch", ...)`` with the method's name as a
string is still accepted, for applications written against it.

The exception: three hot paths send or receive protobuf wire bytes with no
message in between (``Connection.call_serialized``, ``call_raw_reply``,
``stream_serialized``: npstream.proto.wire builds and splits them). The
generated stubs fix their serializers, so those paths open a callable of
their own on the same method's path (``path_of``); they name the method
the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from npstream.errors import InvalidArgument
from npstream.proto import pb, pb_grpc
from npstream.proto.routing import PACKAGE

__all__ = ["Rpc", "Stubs"]

# The proto's services, in declaration order (each one an attribute of Stubs).
SERVICES = tuple(pb.DESCRIPTOR.services_by_name)


class Stubs:
    """One generated stub per service of the proto, on one channel."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.StreamService = pb_grpc.StreamServiceStub(channel)
        self.StreamReadService = pb_grpc.StreamReadServiceStub(channel)
        self.GroupService = pb_grpc.GroupServiceStub(channel)
        self.SinkService = pb_grpc.SinkServiceStub(channel)
        self.ClusterService = pb_grpc.ClusterServiceStub(channel)
        # Each stub method's "Service.Method" name, by the method object (they live as
        # long as the stubs); a service missing above fails here, at the first client.
        self._names: dict[int, str] = {
            id(getattr(getattr(self, service.name), method.name)): f"{service.name}.{method.name}"
            for service in pb.DESCRIPTOR.services_by_name.values() for method in service.methods}

    def method(self, rpc: Rpc | str) -> tuple[Any, str]:
        """The stub method ``rpc`` names on this channel, and its "Service.Method" name."""
        if type(rpc) is not str:
            target = rpc(self)  # type: ignore[operator]
            return target, self._names[id(target)]
        service, _, name = rpc.partition(".")
        stub = getattr(self, service) if service in SERVICES else None
        target = getattr(stub, name, None) if stub is not None and name else None
        if target is None:
            raise InvalidArgument(
                f"unknown rpc {rpc!r}; use 'Service.Method' with a service from "
                f"{sorted(SERVICES)}")
        return target, rpc


def path_of(name: str) -> str:
    """The gRPC method path of ``"Service.Method"``."""
    service, _, method = name.partition(".")
    return f"/{PACKAGE}.{service}/{method}"


# A call's method: the generated stub's attribute, taken from a connection's stubs.
Rpc = Callable[[Stubs], Any]

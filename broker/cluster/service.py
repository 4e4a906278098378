"""ClusterService: where streams live (``Owners``), for clients and for the other members.

Clients ask it before calls that cannot simply follow a redirect: a
streaming publish fed by an iterator, a subscription, a sink task that
splits its rows by the broker that owns each target stream. Members ask it
of each other (with ``x-npstream-cluster-local``) to find a stream's holder.
A broker without members answers too (every name its own, ``self`` empty),
so clients need not know whether they talk to a cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from npstream.broker.errors import InvalidArgumentError
from npstream.broker.rpc.registration import add_service
from npstream.broker.rpc.status import rpc_method
from npstream.broker.streams.registry import check_stream_name
from npstream.proto import pb, pb_grpc

if TYPE_CHECKING:
    from npstream.broker.server.context import BrokerContext

__all__ = ["ClusterServicer", "add_to_server"]

# Names one Owners call may ask about (a sink task asks for its targets).
MAX_OWNERS_NAMES = 10_000


class ClusterServicer(pb_grpc.ClusterServiceServicer):
    def __init__(self, ctx: BrokerContext) -> None:
        self._cluster = ctx.cluster

    @rpc_method
    def Owners(self, request: pb.OwnersRequest,
               context: grpc.ServicerContext) -> pb.OwnersResponse:
        if len(request.streams) > MAX_OWNERS_NAMES:
            raise InvalidArgumentError(f"Owners asks about {len(request.streams)} streams; "
                                       f"at most {MAX_OWNERS_NAMES} per call")
        for name in request.streams:
            check_stream_name(name)
        return self._cluster.owners_reply(request, context)


def add_to_server(server: grpc.Server, ctx: BrokerContext) -> None:
    add_service(server, "ClusterService", ClusterServicer(ctx))

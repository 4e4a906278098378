"""ClusterService: where streams live (``Owners``), for clients and for the other members.

Clients ask it before calls that cannot simply follow a redirect: a
streaming publish fed by an iterator, a subscription, a sink task that
splits its rows by the broker that owns each target stream. Members ask it
of each other (with ``x-npstream-cluster-local``) to find a stream's holder.
A broker without members answers too (every name its own, ``self`` empty),
so clients need not know whether they talk to a cluster.

``MoveStream`` moves a stream to another member (move.py, on the holder) and
``MoveIn`` is the target's side of it (move_in.py); both need the admin
right on the stream, and ``MoveIn`` also takes the cluster's own token
(``[cluster] cluster_token``), with which the source sends a move's steps
when it is set, so a move resumed after a restart needs nobody's token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from npstream.broker import faults
from npstream.broker.auth.access import Right
from npstream.broker.cluster.metrics import ClusterCollector
from npstream.broker.cluster.move import Mover
from npstream.broker.cluster.move_in import MoveReceiver
from npstream.broker.cluster.move_state import MoveBook
from npstream.broker.cluster.tuning import MAX_OWNERS_NAMES
from npstream.broker.errors import InvalidArgumentError
from npstream.broker.rpc.registration import add_service
from npstream.broker.rpc.status import rpc_method
from npstream.broker.streams.names import check_stream_name
from npstream.proto import pb, pb_grpc

if TYPE_CHECKING:
    from npstream.broker.server.context import BrokerContext

__all__ = ["ClusterServicer", "add_to_server"]



class ClusterServicer(pb_grpc.ClusterServiceServicer):
    def __init__(self, ctx: BrokerContext, mover: Mover, receiver: MoveReceiver) -> None:
        self._cluster = ctx.cluster
        self._access = ctx.access
        self._mover = mover
        self._receiver = receiver

    @rpc_method
    def Owners(self, request: pb.OwnersRequest,
               context: grpc.ServicerContext) -> pb.OwnersResponse:
        if len(request.streams) > MAX_OWNERS_NAMES:
            raise InvalidArgumentError(f"Owners asks about {len(request.streams)} streams; "
                                       f"at most {MAX_OWNERS_NAMES} per call")
        for name in request.streams:
            check_stream_name(name)
        return self._cluster.owners_reply(request, context)

    def _check_move(self, stream: str, context: grpc.ServicerContext, *,
                    member_call: bool = False) -> None:
        check_stream_name(stream)
        if member_call:
            self._access.require_internal_or(context, stream, Right.ADMIN)
        else:
            self._access.require(context, stream, Right.ADMIN)
        if not self._cluster.enabled:
            raise InvalidArgumentError("this broker is no member of a cluster: a stream can "
                                       "only move between members ([cluster] etcd)")

    @rpc_method
    def MoveStream(self, request: pb.MoveStreamRequest,
                   context: grpc.ServicerContext) -> pb.MoveStreamResponse:
        self._check_move(request.stream, context)
        return self._mover.move(request.stream, request.to, context)

    @rpc_method
    def MoveIn(self, request: pb.MoveInRequest,
               context: grpc.ServicerContext) -> pb.MoveInResponse:
        self._check_move(request.stream, context, member_call=True)
        return self._receiver.step(request)


class _Moves:
    """What add_to_server hands back to be closed at stop: the resuming thread."""

    def __init__(self, mover: Mover) -> None:
        self._mover = mover

    def close(self) -> None:
        self._mover.close()


def add_to_server(server: grpc.Server, ctx: BrokerContext) -> _Moves:
    """Register the service; a member also resumes its unfinished moves (move.py)."""
    faults.arm_from_env()
    book = MoveBook(ctx.metadata)
    mover = Mover(ctx, book)
    if ctx.cluster.enabled:
        ctx.cluster.moves = book
        mover.start()
    ctx.metrics.registry.register(ClusterCollector(ctx.cluster, book))
    add_service(server, "ClusterService", ClusterServicer(ctx, mover, MoveReceiver(ctx, book)))
    return _Moves(mover)

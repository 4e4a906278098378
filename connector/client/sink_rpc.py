"""SinkService as typed calls: the one place on the client side that names its methods.

The sink client (``npstream.sink.client``) builds on these instead of
``client.call(lambda s: s.SinkService.X, request)``, as the group code
does on ``group_rpc``: a method is named once, a caller sees the response
type it gets back, and the per-RPC call rules live with the RPC. Every
SinkService call is safe to resend (a re-sent staging id replaces the
earlier one, a re-sent commit of a recorded batch appends nothing, an abort
of nothing drops nothing), so all of them retry UNAVAILABLE, except a Stage
naming an inbox file, which its caller sends once (``idempotent=False``).

Arguments are not checked here, and errors are the connection's
(``npstream.errors``); ``SinkClient`` adds the sink's reading of them.

Every call goes to one broker, ``broker`` (an address; None: the client's
own): in a cluster each member keeps its own stagings and commit records, so
a sink stages on the member that holds each target stream and commits on
every member it staged on (docs/exactly-once.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from npstream.proto import pb

if TYPE_CHECKING:
    from npstream.client.core import ClientCore

__all__ = ["abort_batch", "commit_batch", "sink_state", "stage", "stage_inbox"]


def stage(client: ClientCore, request: bytes, *, idempotent: bool = True,
          broker: str | None = None) -> pb.StageResponse:
    """Send a StageRequest already in wire bytes (``encode_stage_request``, or one that
    names an inbox file and carries no data)."""
    response: pb.StageResponse = client.call_serialized(
        lambda s: s.SinkService.Stage, request, pb.StageResponse, idempotent=idempotent,
        broker=broker)
    return response


def commit_batch(client: ClientCore, sink_id: str, batch_id: int,
                 staging_ids: Sequence[str], *, broker: str | None = None,
                 ) -> pb.CommitBatchResponse:
    """Append the listed stagings and record the batch (a recorded batch appends nothing)."""
    response: pb.CommitBatchResponse = client.call(
        lambda s: s.SinkService.CommitBatch, pb.CommitBatchRequest(
            sink_id=sink_id, batch_id=batch_id, staging_ids=list(staging_ids)),
        idempotent=True, broker=broker)
    return response


def abort_batch(client: ClientCore, sink_id: str, batch_id: int,
                staging_ids: Sequence[str], *, broker: str | None = None,
                ) -> pb.AbortBatchResponse:
    """Drop the batch's staging (only ``staging_ids`` when not empty)."""
    response: pb.AbortBatchResponse = client.call(
        lambda s: s.SinkService.AbortBatch, pb.AbortBatchRequest(
            sink_id=sink_id, batch_id=batch_id, staging_ids=list(staging_ids)),
        idempotent=True, broker=broker)
    return response


def sink_state(client: ClientCore, sink_id: str, *,
               broker: str | None = None) -> pb.SinkStateResponse:
    """The sink's last committed batch id."""
    response: pb.SinkStateResponse = client.call(
        lambda s: s.SinkService.SinkState, pb.SinkStateRequest(sink_id=sink_id), idempotent=True,
        broker=broker)
    return response


def stage_inbox(client: ClientCore, *, broker: str | None = None) -> pb.StageInboxResponse:
    """Where the broker's stage inbox is (UNIMPLEMENTED from a broker without one)."""
    response: pb.StageInboxResponse = client.call(
        lambda s: s.SinkService.StageInbox, pb.StageInboxRequest(), broker=broker)
    return response

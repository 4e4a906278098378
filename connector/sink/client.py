"""Client side of exactly-once writes: stage Arrow data, then commit or abort a batch.

Used by the Spark writer (tasks stage, the driver commits), usable by any
application that wants all-or-nothing, replay-safe writes to one or more
streams::

    sink = client.sink()
    sink.stage("nightly-load", 7, "7-part0", "orders", table)
    sink.stage("nightly-load", 7, "7-part1", "orders", other_table)
    sink.commit("nightly-load", 7, ["7-part0", "7-part1"])   # visible at once
    sink.commit("nightly-load", 7, ["7-part0", "7-part1"])   # already_committed, no-op

Every call is safe to retry: a re-sent staging id replaces the earlier one, a
re-sent commit of a recorded batch appends nothing, an abort of nothing drops
nothing. So all of them use the client's retry on UNAVAILABLE.

On the broker's machine ``stage`` hands the data over in a file of the
broker's stage inbox (npstream.sink.inbox) instead of sending it through
gRPC; whatever goes wrong with that, the same request is sent over gRPC.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import pyarrow as pa

from npstream.client import sink_rpc
from npstream.errors import NpstreamError, SinkConflict
from npstream.proto import pb
from npstream.proto.wire import arrow_stream_buffer, encode_with_bytes
from npstream.sink.inbox import InboxUnavailable, StageInboxWriter, turn_off, writer_for

if TYPE_CHECKING:
    from npstream.client.client import Client

__all__ = [
    "CommitResult",
    "SinkClient",
    "SinkConflict",
    "StageResult",
    "arrow_stream_buffer",
    "encode_arrow_stream",
    "encode_stage_request",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageResult:
    rows: int
    bytes: int  # size of the staging file on the broker (0 if the batch was already committed)


@dataclass(frozen=True)
class CommitResult:
    already_committed: bool
    # [start, end) offsets appended per stream; empty when already committed.
    written: dict[str, tuple[int, int]] = field(default_factory=dict)


def encode_arrow_stream(table: pa.Table | pa.RecordBatch) -> bytes:
    """``arrow_stream_buffer`` as bytes, for building a message with protobuf."""
    return arrow_stream_buffer(table).to_pybytes()


def encode_stage_request(head: pb.StageRequest, table: pa.Table | pa.RecordBatch) -> bytes:
    """StageRequest wire bytes: ``head`` with the Arrow data appended with one copy.

    A Stage request holds up to stageBytes of Arrow data; building the message
    with protobuf would copy it into the message and again when serializing
    (npstream.proto.wire appends it to the encoded small fields instead).
    """
    return encode_with_bytes(head, "arrow_stream", [arrow_stream_buffer(table)])


def _sink_error(exc: NpstreamError) -> NpstreamError:
    """The error a sink call raises: the broker's reason decides (npstream.errors).

    Only a FAILED_PRECONDITION without a reason (a broker older than
    ErrorReason) is guessed: from a sink call it is most likely a conflict
    with the sink's state, so it becomes SinkConflict rather than the
    code's general meaning, StreamNeedsRepair.
    """
    if (exc.reason is None and exc.code == grpc.StatusCode.FAILED_PRECONDITION
            and not isinstance(exc, SinkConflict)):
        return SinkConflict(str(exc), code=exc.code)
    return exc


class SinkClient:
    """Stage / commit / abort / state calls of SinkService over a Client's connection.

    ``local_staging``: on the broker's machine, hand Stage data over in a
    file of the broker's inbox (see the module doc); False: always gRPC.
    """

    def __init__(self, client: Client, *, local_staging: bool = True) -> None:
        self._client = client
        self._local_staging = local_staging

    @staticmethod
    def _converted(send: Callable[[], Any]) -> Any:
        """``send()``'s reply; a reasonless FAILED_PRECONDITION is raised as SinkConflict."""
        try:
            return send()
        except NpstreamError as exc:
            converted = _sink_error(exc)
            if converted is exc:
                raise
            raise converted from None

    def stage(self, sink_id: str, batch_id: int, staging_id: str, stream: str | None,
              table: pa.Table | pa.RecordBatch) -> StageResult:
        """Store rows durably on the broker under staging_id; invisible until committed.

        Columns: ``value`` (required), optional ``id``, ``key``, ``headers`` and
        ``stream`` (per-row target; rows with a null ``stream`` go to ``stream``).
        A bad row rejects the whole call (InvalidArgument naming the row).
        """
        head = pb.StageRequest(sink_id=sink_id, batch_id=batch_id, staging_id=staging_id,
                               stream=stream or "")
        writer = self._inbox_writer()
        reply = self._stage_by_file(writer, head, table) if writer is not None else None
        if reply is None:
            request = encode_stage_request(head, table)
            reply = self._converted(lambda: sink_rpc.stage(self._client, request))
        return StageResult(rows=reply.staged_rows, bytes=reply.staged_bytes)

    def _inbox_writer(self) -> StageInboxWriter | None:
        if not self._local_staging:
            return None

        def describe() -> pb.StageInboxResponse:
            try:
                return sink_rpc.stage_inbox(self._client)
            except NpstreamError as exc:
                if exc.code == grpc.StatusCode.UNIMPLEMENTED:
                    raise InboxUnavailable("the broker predates the stage inbox") from None
                raise

        return writer_for(self._client.address, describe)

    def _stage_by_file(self, writer: StageInboxWriter, head: pb.StageRequest,
                       table: pa.Table | pa.RecordBatch) -> pb.StageResponse | None:
        """The broker's reply to a Stage naming an inbox file; None: send the data instead.

        Sent once, without retries: a file goes back for reuse only after a
        reply to its only attempt, so no attempt the broker may still be
        running reads it while it is rewritten (after an error it is deleted).
        """
        try:
            file, length = writer.write(pa.Table.from_batches([table])
                                        if isinstance(table, pa.RecordBatch) else table)
        except InboxUnavailable as exc:
            turn_off(self._client.address, str(exc))
            return None
        request = pb.StageRequest()
        request.CopyFrom(head)
        request.inbox_file, request.inbox_inode, request.inbox_length = (
            file.name, file.inode, length)
        answered = False
        try:
            reply = sink_rpc.stage(self._client, request.SerializeToString(), idempotent=False)
            answered = True
        except NpstreamError as exc:
            log.debug("Stage of '%s' naming inbox file %s failed (%s); sending the data",
                      head.staging_id, file.name, exc)
            return None
        finally:
            writer.release(file, reusable=answered)
        if reply.inbox_refused:
            turn_off(self._client.address, f"the broker refused {file.name}: "
                                           f"{reply.inbox_refused}")
            return None
        return reply

    def commit(self, sink_id: str, batch_id: int, staging_ids: list[str]) -> CommitResult:
        """Make the listed stagings visible at once (per stream) and record the batch."""
        reply: pb.CommitBatchResponse = self._converted(
            lambda: sink_rpc.commit_batch(self._client, sink_id, batch_id, staging_ids))
        return CommitResult(
            already_committed=reply.already_committed,
            written={w.stream: (w.start_offset, w.end_offset) for w in reply.written},
        )

    def abort(self, sink_id: str, batch_id: int, staging_ids: list[str] | None = None) -> int:
        """Drop the batch's staging (only the listed ids when given); returns files dropped."""
        reply: pb.AbortBatchResponse = self._converted(
            lambda: sink_rpc.abort_batch(self._client, sink_id, batch_id, staging_ids or []))
        return int(reply.dropped)

    def last_batch_id(self, sink_id: str) -> int:
        """The sink's last committed batch id, -1 when none."""
        reply: pb.SinkStateResponse = self._converted(
            lambda: sink_rpc.sink_state(self._client, sink_id))
        return int(reply.last_batch_id)

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

In a cluster of brokers each member keeps its own stagings and its own record
of committed batches, and rows can only be staged on the member that holds
their target stream. So ``stage`` splits its rows by the broker of each
target (asked once per stream, ``Client.brokers_of``) and stages each part
there under the same staging id; ``StageResult.brokers`` says where. The
batch is then committed on each of those brokers (``commit_all``), each
commit idempotent per (sink id, batch id) on its broker: a batch replayed
after a crash between two brokers' commits appends nothing on the broker
that had committed it and its rows on the one that had not, so every stream
gets the batch exactly once (docs/exactly-once.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import pyarrow as pa
import pyarrow.compute as pc

from npstream.client import sink_rpc
from npstream.errors import NotOwner, NpstreamError, SinkConflict, StagedRowsMoved
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
    "StagedRowsMoved",
    "arrow_stream_buffer",
    "encode_arrow_stream",
    "encode_stage_request",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageResult:
    rows: int
    bytes: int  # size of the staging file(s) on the broker(s) (0: batch already committed)
    # The brokers (addresses) that hold rows of this staging id: one, or in a
    # cluster each member holding a target stream of the rows.
    brokers: tuple[str, ...] = ()


@dataclass(frozen=True)
class CommitResult:
    already_committed: bool  # on every broker committed on: nothing was appended
    # [start, end) offsets appended per stream; empty when already committed.
    written: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Each broker committed on, and whether it had committed the batch before.
    brokers: dict[str, bool] = field(default_factory=dict)


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
        A bad row rejects the whole call (InvalidArgument naming the row). In a
        cluster the rows go to the brokers of their target streams (module doc).
        """
        head = pb.StageRequest(sink_id=sink_id, batch_id=batch_id, staging_id=staging_id,
                               stream=stream or "")
        try:
            parts = self._parts(stream, table)
            replies = [(broker, self._stage_on(broker, head, part)) for broker, part in parts]
        except NotOwner as moved:  # an owner learnt earlier is stale: ask again, once
            log.debug("staging '%s' of sink '%s': %s; asking where its streams are again",
                      staging_id, sink_id, moved)
            self._client.forget_brokers(_targets(stream, table))
            parts = self._parts(stream, table)
            replies = [(broker, self._stage_on(broker, head, part)) for broker, part in parts]
        return StageResult(rows=sum(r.staged_rows for _b, r in replies),
                           bytes=sum(r.staged_bytes for _b, r in replies),
                           brokers=tuple(broker for broker, _r in replies))

    def _parts(self, stream: str | None,
               table: pa.Table | pa.RecordBatch) -> list[tuple[str, pa.Table | pa.RecordBatch]]:
        """The rows for each broker: the whole table when one broker holds every target."""
        targets = _targets(stream, table)
        owners = self._client.brokers_of(targets) if targets else {}
        brokers = sorted(set(owners.values()))
        column = table.column("stream") if len(brokers) > 1 else None
        if column is None or (column.null_count and not stream):
            # One broker; or rows without a target, which the broker refuses naming them.
            return [(brokers[0] if brokers else self._client.address, table)]
        parts = []
        for broker in brokers:
            names = [name for name, owner in owners.items() if owner == broker]
            mask = pc.is_in(column, value_set=pa.array(names, pa.string()))
            if stream is not None and owners.get(stream) == broker:
                mask = pc.or_(mask, pc.is_null(column))
            parts.append((broker, table.filter(pc.fill_null(mask, False))))
        return parts

    def _stage_on(self, broker: str, head: pb.StageRequest,
                  table: pa.Table | pa.RecordBatch) -> pb.StageResponse:
        """Stage ``table`` on ``broker``: by inbox file on its machine, else over gRPC."""
        writer = self._inbox_writer(broker)
        reply = self._stage_by_file(broker, writer, head, table) if writer is not None else None
        if reply is None:
            request = encode_stage_request(head, table)
            reply = self._converted(lambda: sink_rpc.stage(self._client, request,
                                                           broker=broker))
        return reply

    def _inbox_writer(self, broker: str) -> StageInboxWriter | None:
        if not self._local_staging:
            return None

        def describe() -> pb.StageInboxResponse:
            try:
                return sink_rpc.stage_inbox(self._client, broker=broker)
            except NpstreamError as exc:
                if exc.code == grpc.StatusCode.UNIMPLEMENTED:
                    raise InboxUnavailable("the broker predates the stage inbox") from None
                raise

        return writer_for(broker, describe)

    def _stage_by_file(self, broker: str, writer: StageInboxWriter, head: pb.StageRequest,
                       table: pa.Table | pa.RecordBatch) -> pb.StageResponse | None:
        """The broker's reply to a Stage naming an inbox file; None: send the data instead.

        Sent once, without retries: a file goes back for reuse only after a
        reply to its only attempt, so no attempt the broker may still be
        running reads it while it is rewritten (after an error it is deleted).
        A redirect (NotOwner) is raised: the rows belong elsewhere.
        """
        try:
            file, length = writer.write(pa.Table.from_batches([table])
                                        if isinstance(table, pa.RecordBatch) else table)
        except InboxUnavailable as exc:
            turn_off(broker, str(exc))
            return None
        request = pb.StageRequest()
        request.CopyFrom(head)
        request.inbox_file, request.inbox_inode, request.inbox_length = (
            file.name, file.inode, length)
        answered = False
        try:
            reply = sink_rpc.stage(self._client, request.SerializeToString(), idempotent=False,
                                   broker=broker)
            answered = True
        except NotOwner:
            answered = True  # refused before the file was read
            raise
        except NpstreamError as exc:
            log.debug("Stage of '%s' naming inbox file %s failed (%s); sending the data",
                      head.staging_id, file.name, exc)
            return None
        finally:
            writer.release(file, reusable=answered)
        if reply.inbox_refused:
            turn_off(broker, f"the broker refused {file.name}: {reply.inbox_refused}")
            return None
        return reply

    def commit(self, sink_id: str, batch_id: int, staging_ids: list[str], *,
               broker: str | None = None) -> CommitResult:
        """Make the listed stagings visible at once (per stream) and record the batch.

        On ``broker`` (an address; None: the client's own broker).
        """
        try:
            reply: pb.CommitBatchResponse = self._converted(
                lambda: sink_rpc.commit_batch(self._client, sink_id, batch_id, staging_ids,
                                              broker=broker))
        except NotOwner as moved:
            where = broker or self._client.address
            raise StagedRowsMoved(
                f"sink '{sink_id}' batch {batch_id}: rows staged on {where} for stream "
                f"'{moved.stream}' cannot commit there, the stream moved to {moved.owner} after "
                f"they were staged; nothing of this commit was appended on {where}. Stage the "
                f"batch again (its rows then go to {moved.owner}) and commit it: it stays "
                "exactly once (a Spark query fails this batch; restarted from its checkpoint, "
                "it runs the batch again)", stream=moved.stream, owner=moved.owner) from None
        return CommitResult(
            already_committed=reply.already_committed,
            written={w.stream: (w.start_offset, w.end_offset) for w in reply.written},
            brokers={broker or self._client.address: reply.already_committed},
        )

    def commit_all(self, sink_id: str, batch_id: int,
                   staged: Mapping[str, Sequence[str]]) -> CommitResult:
        """Commit the batch on every broker of ``staged`` ({broker: its staging ids}).

        One broker after the other, each idempotent on its own: after a crash
        part-way, committing the replayed batch again appends on the brokers
        that had not committed and nothing on those that had. With nothing
        staged anywhere the batch is recorded on the client's own broker.
        """
        if not staged:
            staged = {self._client.address: []}
        written: dict[str, tuple[int, int]] = {}
        brokers: dict[str, bool] = {}
        for broker in sorted(staged):
            result = self.commit(sink_id, batch_id, list(staged[broker]), broker=broker)
            written.update(result.written)
            brokers.update(result.brokers)
        return CommitResult(already_committed=all(brokers.values()), written=written,
                            brokers=brokers)

    def abort(self, sink_id: str, batch_id: int, staging_ids: list[str] | None = None, *,
              broker: str | None = None) -> int:
        """Drop the batch's staging (only the listed ids when given); returns files dropped."""
        reply: pb.AbortBatchResponse = self._converted(
            lambda: sink_rpc.abort_batch(self._client, sink_id, batch_id, staging_ids or [],
                                         broker=broker))
        return int(reply.dropped)

    def last_batch_id(self, sink_id: str, *, broker: str | None = None) -> int:
        """The sink's last committed batch id on ``broker`` (None: the client's), -1 when none."""
        reply: pb.SinkStateResponse = self._converted(
            lambda: sink_rpc.sink_state(self._client, sink_id, broker=broker))
        return int(reply.last_batch_id)


def _targets(stream: str | None, table: pa.Table | pa.RecordBatch) -> list[str]:
    """The target streams of a stage: the ``stream`` column's names, ``stream`` for its nulls."""
    if "stream" not in table.schema.names:
        return [stream] if stream else []
    column = table.column("stream")
    if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
        return [stream] if stream else []  # the broker refuses the column, naming it
    names: Iterable[str] = (name for name in pc.unique(column).to_pylist() if name)
    targets = list(names)
    if stream and column.null_count:
        targets.append(stream)
    return targets

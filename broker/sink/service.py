"""SinkService: the gRPC face of exactly-once writes (Stage, CommitBatch, AbortBatch, SinkState).

The protocol lives in the rest of the package: committer.py (commit, abort),
markers.py (what a commit records), recovery.py (finishing interrupted
commits), gc.py (deleting staging nothing will commit, the sweep thread),
staging.py and staging_format.py (what a Stage stores). This module decodes
requests (Stage's from its wire bytes, its Arrow data used in place), maps
them onto those, counts what happened in metrics, and wires the parts
together. A Stage request may name a file of the stage inbox instead of
carrying its data (inbox.py); a file that cannot be used is answered with
``inbox_refused`` and the client sends the rows again over gRPC. Sink
recovery runs inside ``add_to_server``, before the server starts, so no
client ever sees a half-finished commit of a previous run.
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from typing import TYPE_CHECKING

import grpc
import pyarrow as pa
from google.protobuf.message import DecodeError
from prometheus_client import Counter, Histogram

from npstream.broker import faults
from npstream.broker.errors import (
    DiskFullError,
    InvalidArgumentError,
    StreamNotFoundError,
    is_disk_full,
)
from npstream.broker.rpc.arrow_input import decode_arrow_stream
from npstream.broker.rpc.registration import add_service, check_ranges
from npstream.broker.rpc.status import rpc_method
from npstream.broker.sink.access import require_sink_write, staged_targets, writable_targets
from npstream.broker.sink.committer import SinkCommitter
from npstream.broker.sink.gc import StagingGC, StagingSweeper
from npstream.broker.sink.inbox import INBOX_DIR_NAME, InboxRefused, StageInbox
from npstream.broker.sink.markers import SinkMarkers
from npstream.broker.sink.recovery import recover
from npstream.broker.sink.staging import (
    STAGING_DIR,
    StageTarget,
    StagingArea,
    check_batch_id,
    check_sink_id,
    check_staging_id,
    prepare_stage,
)
from npstream.proto import pb, pb_grpc
from npstream.proto.wire import split_bytes_field

if TYPE_CHECKING:
    from npstream.broker.server.context import BrokerContext

__all__ = ["SinkMetrics", "SinkServicer", "add_to_server"]

log = logging.getLogger(__name__)

# A commit renames adopted stagings in (milliseconds) or copies small ones and
# fsyncs them (tens of milliseconds for large batches on slow disks).
COMMIT_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                          5.0, 10.0)


class SinkMetrics:
    """Sink counters on the broker's registry (no labels: cost independent of sink count)."""

    def __init__(self, ctx: BrokerContext) -> None:
        registry = ctx.metrics.registry
        self.staged_rows = Counter("npstream_sink_staged_rows", "Rows stored by Stage",
                                   registry=registry)
        self.staged_bytes = Counter("npstream_sink_staged_bytes",
                                    "Bytes of staging files written by Stage", registry=registry)
        self.commits = Counter("npstream_sink_commits", "CommitBatch calls that appended",
                               registry=registry)
        self.replayed_commits = Counter("npstream_sink_replayed_commits",
                                        "CommitBatch calls for an already committed batch",
                                        registry=registry)
        self.committed_rows = Counter("npstream_sink_committed_rows",
                                      "Rows appended by CommitBatch", registry=registry)
        self.dropped_staging = Counter("npstream_sink_dropped_staging_files",
                                       "Staging files dropped by AbortBatch or the sweep",
                                       registry=registry)
        self.inbox_stages = Counter("npstream_sink_inbox_stages",
                                    "Stage requests whose data was read from the stage inbox",
                                    registry=registry)
        self.inbox_refused = Counter("npstream_sink_inbox_refused",
                                     "Stage requests naming an inbox file that could not be "
                                     "used (the client resends the data)", registry=registry)
        self.commit_latency = Histogram(
            "npstream_sink_commit_latency_seconds",
            "Duration of one CommitBatch that appended (stagings adopted or copied, fsynced, "
            "marker written)", buckets=COMMIT_LATENCY_BUCKETS, registry=registry)


def _split_stage_request(raw: bytes) -> tuple[pb.StageRequest, memoryview]:
    """The request's small fields, and its Arrow data as a view into ``raw`` (not copied).

    Stage is registered with raw requests: parsing the message would copy its
    arrow_stream (up to stageBytes) into it, and reading the field copies it
    again. An empty view when the field is unset; the last value when it
    occurs twice (protobuf's merge rule for a singular field).
    """
    try:
        request, arrow = split_bytes_field(raw, pb.StageRequest, "arrow_stream")
    except DecodeError as exc:
        raise InvalidArgumentError(f"malformed StageRequest: {exc}") from None
    return check_ranges(request), arrow[-1] if arrow else memoryview(b"")


def _check_not_empty(request: pb.StageRequest, arrow_stream: memoryview | pa.Buffer) -> None:
    if not len(arrow_stream):
        raise InvalidArgumentError(
            f"stage for sink '{request.sink_id}' batch {request.batch_id} has an empty "
            "arrow_stream; send an Arrow IPC stream with at least a 'value' column")


class SinkServicer(pb_grpc.SinkServiceServicer):
    def __init__(self, ctx: BrokerContext, committer: SinkCommitter,
                 metrics: SinkMetrics, inbox: StageInbox | None = None) -> None:
        self._registry = ctx.registry
        self._committer = committer
        self._staging = committer.staging
        self._metrics = metrics
        self._inbox = inbox
        self._access = ctx.access
        self._cluster = ctx.cluster  # Stage's target streams must be this member's
        self._count_in = ctx.metrics.count_in
        self._budget = ctx.publish_budget
        self._max_message_bytes = ctx.config.server.grpc_max_message_bytes

    def _target(self, stream: str) -> StageTarget:
        """A Stage target: its limit and value schemas; for a stream Commit will
        auto-create, the broker default and untyped (StreamNotFoundError without
        auto-create)."""
        try:
            stream_log = self._registry.get(stream)
        except StreamNotFoundError:
            if not self._registry.auto_create:
                raise
            return StageTarget(self._registry.effective_config({}).max_message_bytes,
                               exists=False)
        return StageTarget(stream_log.config.max_message_bytes, stream_log.value_schemas)

    @rpc_method
    def Stage(self, raw: bytes, context: grpc.ServicerContext) -> pb.StageResponse:
        """Store one task's rows; ``raw`` is the StageRequest's wire bytes (add_to_server).

        The call was admitted against the publish memory budget before it was
        read (rpc/budget.py); the bytes of an inbox file, read into memory
        here, are admitted too.
        """
        request, arrow_stream = _split_stage_request(raw)
        inbox_bytes = (min(request.inbox_length, self._max_message_bytes)
                       if request.inbox_file else 0)
        with ExitStack() as room:  # the inbox file's and the decoded rows' budget
            room.enter_context(self._budget.admitted(inbox_bytes,
                                                     f"stage to stream '{request.stream}'"))
            return self._stage(request, arrow_stream, context, room, len(raw) + inbox_bytes)

    def _stage(self, request: pb.StageRequest, arrow_stream: memoryview | pa.Buffer,
               context: grpc.ServicerContext, room: ExitStack,
               held: int) -> pb.StageResponse:
        sink_id = check_sink_id(request.sink_id)
        batch_id = check_batch_id(request.batch_id)
        staging_id = check_staging_id(request.staging_id)
        if request.inbox_file:
            try:
                arrow_stream = self._read_inbox(request)
            except InboxRefused as refused:
                self._metrics.inbox_refused.inc()
                log.info("sink '%s' batch %d staging '%s': inbox file refused (%s); the "
                         "client resends it over gRPC", sink_id, batch_id, staging_id, refused)
                return pb.StageResponse(inbox_refused=str(refused))
            self._metrics.inbox_stages.inc()
        _check_not_empty(request, arrow_stream)
        data = decode_arrow_stream(
            arrow_stream, f"arrow_stream of sink '{sink_id}' batch {batch_id} staging "
            f"'{staging_id}'", limit=self._max_message_bytes, budget=self._budget, held=held,
            room=room)
        if self._committer.is_committed(sink_id, batch_id):
            # A restarted query re-runs its last batch before learning it was committed:
            # accept (the task must not fail) and keep nothing; the commit will be a no-op.
            log.info("sink '%s' batch %d is already committed: staging '%s' (%d rows) "
                     "discarded", sink_id, batch_id, staging_id, data.num_rows)
            return pb.StageResponse(staged_rows=data.num_rows, staged_bytes=0)
        table = prepare_stage(data, request.stream, writable_targets(
            self._access, context, self._cluster.owned(context, self._target)))
        try:
            # Counted per target stream while it writes: a move drains them first (move.py).
            with self._cluster.staging(table.streams):
                size = self._staging.write(sink_id, batch_id, staging_id, table)
        except OSError as exc:
            if is_disk_full(exc):  # the staging area removed what it had written
                raise DiskFullError(request.stream, f"stage of sink '{sink_id}' batch "
                                    f"{batch_id} staging '{staging_id}'", exc) from exc
            raise
        self._metrics.staged_rows.inc(table.num_rows)
        self._metrics.staged_bytes.inc(size)
        log.debug("sink '%s' batch %d staged '%s': %d rows, %d bytes",
                  sink_id, batch_id, staging_id, table.num_rows, size)
        return pb.StageResponse(staged_rows=table.num_rows, staged_bytes=size)

    def _read_inbox(self, request: pb.StageRequest) -> pa.Buffer:
        if self._inbox is None:
            raise InboxRefused("this broker offers no stage inbox (sink_stage_inbox = false)")
        return self._inbox.read(request.inbox_file, request.inbox_inode, request.inbox_length)

    @rpc_method
    def CommitBatch(self, request: pb.CommitBatchRequest,
                    context: grpc.ServicerContext) -> pb.CommitBatchResponse:
        if self._access.enabled:
            require_sink_write(self._access, context, staged_targets(
                self._staging, request.sink_id, request.batch_id, request.staging_ids),
                "commit sink batches")
        started = time.perf_counter()
        outcome = self._committer.commit(request.sink_id, request.batch_id,
                                         list(request.staging_ids))
        if outcome.already_committed:
            self._metrics.replayed_commits.inc()
        else:
            self._metrics.commit_latency.observe(time.perf_counter() - started)
            self._metrics.commits.inc()
            self._metrics.committed_rows.inc(
                sum(end - start for start, end in outcome.written.values()))
            for stream, (start, end) in outcome.written.items():
                self._count_in(stream, end - start)
        return pb.CommitBatchResponse(
            already_committed=outcome.already_committed,
            written=[pb.StreamOffsets(stream=s, start_offset=a, end_offset=b)
                     for s, (a, b) in outcome.written.items()],
        )

    @rpc_method
    def AbortBatch(self, request: pb.AbortBatchRequest,
                   context: grpc.ServicerContext) -> pb.AbortBatchResponse:
        if self._access.enabled:
            require_sink_write(self._access, context, staged_targets(
                self._staging, request.sink_id, request.batch_id,
                list(request.staging_ids) or None), "abort sink batches")
        dropped = self._committer.abort(request.sink_id, request.batch_id,
                                        list(request.staging_ids) or None)
        self._metrics.dropped_staging.inc(dropped)
        return pb.AbortBatchResponse(dropped=dropped)

    @rpc_method
    def SinkState(self, request: pb.SinkStateRequest,
                  context: grpc.ServicerContext) -> pb.SinkStateResponse:
        exists, last = self._committer.state(request.sink_id)
        return pb.SinkStateResponse(exists=exists, last_batch_id=last)

    @rpc_method
    def StageInbox(self, request: pb.StageInboxRequest,
                   context: grpc.ServicerContext) -> pb.StageInboxResponse:
        return self._inbox.describe() if self._inbox is not None else pb.StageInboxResponse()


def add_to_server(server: grpc.Server, ctx: BrokerContext) -> StagingSweeper:
    """Recover unfinished commits, register SinkService, start the staging sweep."""
    config = ctx.config
    faults.arm_from_env()  # tests' crash points; ValueError for a malformed value
    staging = StagingArea(config.server.data_dir / STAGING_DIR,
                          max_frame_bytes=config.storage.max_batch_bytes,
                          direct_writes=config.sink.sink_direct_writes)
    markers = SinkMarkers(ctx.metadata, durable=config.storage.metadata_sync != "full")
    committer = SinkCommitter(markers, ctx.registry, staging,
                              adopt_min_bytes=config.sink.sink_adopt_min_bytes,
                              write_guard=lambda stream: ctx.cluster.local_write(stream))
    gc = StagingGC(markers, staging, moved_away=lambda stream: (
        ctx.cluster.moves.moved_away(stream) if ctx.cluster.moves is not None else None))
    finished = recover(committer, gc)
    if finished:
        log.warning("sink recovery finished %d interrupted commit(s)", finished)
    ctx.on_stream_deleted.append(gc.on_stream_deleted)
    metrics = SinkMetrics(ctx)
    inbox = None
    if config.sink.sink_stage_inbox:
        inbox = StageInbox(config.server.data_dir / INBOX_DIR_NAME,
                           max_bytes=config.server.grpc_max_message_bytes)
    add_service(server, "SinkService", SinkServicer(ctx, committer, metrics, inbox),
                raw_requests={"Stage"})
    ttl_ms = config.sink.sink_staging_ttl_ms
    sweeper = StagingSweeper(gc, ttl_ms, metrics.dropped_staging.inc, inbox).start()
    log.info("sink service ready: staging in %s, stage inbox %s, staging ttl %d ms, "
             "sweep every %.1fs", staging.root, inbox.root if inbox else "off", ttl_ms,
             sweeper.interval_s)
    return sweeper

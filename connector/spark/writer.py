"""The ``npstream`` Spark sink: exactly-once streaming writes and all-or-nothing batch writes.

How a micro-batch is written (docs/exactly-once.md has the whole argument):

1. Each task (``write``, on an executor) sends its Arrow batches to the broker
   with ``Stage`` in requests of about ``stageBytes``, each under its own
   staging id ``<batchId>-<partition>-<attempt>-<random>-<n>``; staged rows are
   durable but invisible. It returns the staging ids as its commit message.
2. The driver's ``commit(messages, batchId)`` sends one ``CommitBatch`` with
   every staging id: the broker appends them (contiguous per stream, fsynced)
   and records (sink id, batchId). A replayed batchId (a restarted query
   re-running its last batch) appends nothing.
3. ``abort(messages, batchId)`` drops the batch's staging; staging of a task
   attempt that was never listed (a failed or speculative attempt) is never
   appended and is garbage-collected by the broker.

With a cluster of brokers, a task stages the rows of each target stream on
the member that holds it (npstream.sink.client), and its commit message says
which staging ids each member holds; the driver commits the batch on each of
those members, one ``CommitBatch`` each. Every member records (sink id,
batchId) on its own, so a batch replayed after a crash between two members'
commits appends only on the members that had not committed it: exactly once
per stream.

Rows move as Arrow end to end: the task never converts to Python rows. A
typed stream's fields written as columns are packed into the ``value``
struct by each task (no copy); the broker converts them to the stream's
schema at Stage (write_target.py checks them against it at query start).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from npstream.errors import NpstreamError
from npstream.spark.checkpoint import (
    QUERY_ID_PROPERTY,
    check_planned_batches,
    checkpoint_dir,
    query_sink_id,
)
from npstream.spark.errors import NoMicroBatchError
from npstream.spark.write_target import check_write_target
from npstream.spark.writer_options import WriteOptions, parse_write_options

__all__ = [
    "NoMicroBatchError",
    "NpstreamBatchWriter",
    "NpstreamCommitMessage",
    "NpstreamStreamWriter",
    "make_batch_writer",
    "make_stream_writer",
]

log = logging.getLogger(__name__)

# Spark sets this local property on every task of a micro-batch (MicroBatchExecution).
BATCH_ID_PROPERTY = "streaming.sql.batchId"
# A batch write is one commit: batch id 0 of a sink id unique to the job.
BATCH_WRITE_BATCH_ID = 0
# Stage requests a task has in flight at once (each about stageBytes), sent by
# as many threads: while the broker waits for one request's fsync it stores
# the other, and Spark produces the next chunk meanwhile (measured: a third
# gains nothing on 2 cores, one alone makes staging ~1.5x slower). Also bounds
# the task's extra memory to two requests.
STAGE_REQUESTS_IN_FLIGHT = 2


@dataclass
class NpstreamCommitMessage(WriterCommitMessage):
    """What a task reports to the driver: its staging ids, in the order they were staged."""

    partition_id: int
    sink_id: str = ""  # what the task staged under (the driver may not know the query's id)
    staging_ids: list[str] = field(default_factory=list)
    rows: int = 0
    # Each broker's staging ids of this task, in staging order (a cluster's members
    # each hold the rows of their streams; one broker: all of them).
    brokers: dict[str, list[str]] = field(default_factory=dict)


def _packed(batch: pa.RecordBatch, value_fields: tuple[str, ...]) -> pa.RecordBatch:
    """``batch`` with ``value_fields`` as one struct column ``value`` (a typed record; no copy)."""
    fields = [batch.schema.field(name) for name in value_fields]
    value = pa.StructArray.from_arrays([batch.column(name) for name in value_fields],
                                       fields=fields)
    rest = [name for name in batch.schema.names if name not in value_fields]
    return pa.RecordBatch.from_arrays([*(batch.column(name) for name in rest), value],
                                      names=[*rest, "value"])


def _chunks(batches: Iterable[pa.RecordBatch], columns: tuple[str, ...],
            target_bytes: int, value_fields: tuple[str, ...] = ()) -> Iterator[pa.Table]:
    """Tables of about target_bytes of the wanted columns (batches are sliced, never copied).

    ``value_fields``: columns that are a typed stream's fields, packed into
    the ``value`` struct the broker expects.
    """
    pending: list[pa.RecordBatch] = []
    pending_bytes = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        batch = batch.select(list(columns))
        if value_fields:
            batch = _packed(batch, value_fields)
        size = batch.nbytes
        if size > target_bytes and batch.num_rows > 1:
            rows_per_chunk = max(1, int(batch.num_rows * target_bytes / size))
            pieces = [batch.slice(start, rows_per_chunk)
                      for start in range(0, batch.num_rows, rows_per_chunk)]
        else:
            pieces = [batch]
        for piece in pieces:
            piece_bytes = piece.nbytes if piece is not batch else size
            if pending and pending_bytes + piece_bytes > target_bytes:
                yield pa.Table.from_batches(pending)
                pending, pending_bytes = [], 0
            pending.append(piece)
            pending_bytes += piece_bytes
    if pending:
        yield pa.Table.from_batches(pending)


def _stage_all(options: WriteOptions, batch_id: int, iterator: Iterable[pa.RecordBatch],
               ) -> NpstreamCommitMessage:
    """Stage one task's rows; the commit message lists its staging ids.

    Stage requests go out from background threads, at most
    STAGE_REQUESTS_IN_FLIGHT at once, so the broker's fsync of one request
    overlaps storing the next and Spark handing over the batches after it.
    The staging ids carry the order, so requests may complete in any order.
    """
    from pyspark import TaskContext

    from npstream.sink.client import SinkClient, StageResult

    assert options.sink_id is not None
    sink_id = options.sink_id
    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    attempt = context.attemptNumber() if context else 0
    prefix = f"{batch_id}-{partition}-{attempt}-{uuid.uuid4().hex[:8]}"
    message = NpstreamCommitMessage(partition_id=partition, sink_id=sink_id)
    default_stream = None if options.use_stream_column else options.stream

    with options.connection.connect() as client, ThreadPoolExecutor(
            max_workers=STAGE_REQUESTS_IN_FLIGHT, thread_name_prefix="npstream-stage") as sender:
        sink = SinkClient(client, local_staging=options.local_staging)

        def stage(staging_id: str, table: pa.Table, first_row: int) -> StageResult:
            try:
                return sink.stage(sink_id, batch_id, staging_id, default_stream, table)
            except NpstreamError as exc:
                wrapped = type(exc)(
                    f"npstream sink '{sink_id}' batch {batch_id} partition {partition}: "
                    f"cannot stage rows {first_row}..{first_row + table.num_rows - 1} of this "
                    f"partition (row numbers in the message below count from {first_row}): "
                    f"{exc}")
                # Same class, more context: the broker's status and reason stay.
                wrapped.code, wrapped.reason = exc.code, exc.reason
                raise wrapped from None

        in_flight: deque[tuple[str, Future[StageResult]]] = deque()

        def staged(staging_id: str, future: Future[StageResult]) -> None:
            for broker in future.result().brokers:
                message.brokers.setdefault(broker, []).append(staging_id)

        for table in _chunks(iterator, options.columns, options.stage_bytes,
                             options.value_fields):
            if len(in_flight) >= STAGE_REQUESTS_IN_FLIGHT:
                staged(*in_flight.popleft())
            staging_id = f"{prefix}-{len(message.staging_ids)}"
            in_flight.append((staging_id, sender.submit(stage, staging_id, table, message.rows)))
            message.staging_ids.append(staging_id)
            message.rows += table.num_rows
        for pending in in_flight:
            staged(*pending)
    log.debug("sink '%s' batch %d partition %d staged %d rows in %d request(s)",
              sink_id, batch_id, partition, message.rows, len(message.staging_ids))
    return message


def _staging_ids(messages: Sequence[WriterCommitMessage | None]) -> dict[str, list[str]]:
    """Each broker's staging ids, tasks in partition order (the order rows appear in
    the streams)."""
    ours = [m for m in messages if isinstance(m, NpstreamCommitMessage)]
    ours.sort(key=lambda m: m.partition_id)
    staged: dict[str, list[str]] = {}
    for message in ours:
        for broker, staging_ids in message.brokers.items():
            staged.setdefault(broker, []).extend(staging_ids)
    return staged


def _sink_id(options: WriteOptions,
             messages: Sequence[WriterCommitMessage | None]) -> str | None:
    """The sink id of a batch: the options', else the one the tasks staged under
    (the query's id); None when neither is known (no task reported)."""
    if options.sink_id is not None:
        return options.sink_id
    return next((m.sink_id for m in messages if isinstance(m, NpstreamCommitMessage)), None)


def _commit(options: WriteOptions, batch_id: int,
            messages: list[WriterCommitMessage | None]) -> None:
    from npstream.sink.client import SinkClient

    sink_id = _sink_id(options, messages)
    if sink_id is None:
        log.info("npstream sink: batch %d has no task output; nothing to commit", batch_id)
        return
    staged = _staging_ids(messages)
    with options.connection.connect() as client:
        result = SinkClient(client).commit_all(sink_id, batch_id, staged)
    replayed = sorted(broker for broker, before in result.brokers.items() if before)
    if result.already_committed:
        log.info("npstream sink '%s' batch %d was already committed; nothing appended",
                 sink_id, batch_id)
    else:
        log.info("npstream sink '%s' committed batch %d: %s%s", sink_id, batch_id,
                 ", ".join(f"{s} [{a},{b})" for s, (a, b) in result.written.items()) or "empty",
                 f" (already committed on {', '.join(replayed)})" if replayed else "")


def _abort(options: WriteOptions, batch_id: int,
           messages: Sequence[WriterCommitMessage | None] = ()) -> None:
    """Drop the batch's staging on every broker it was staged on (and the client's own);
    a failure is logged, never raised over Spark's own error."""
    from npstream.sink.client import SinkClient

    sink_id = _sink_id(options, messages)
    if sink_id is None:  # no task reported; the broker drops their staging after the TTL
        log.info("npstream sink: batch %d aborted before any task reported", batch_id)
        return
    try:
        with options.connection.connect() as client:
            sink = SinkClient(client)
            brokers = sorted({client.address, *_staging_ids(messages)})
            dropped = sum(sink.abort(sink_id, batch_id, broker=broker) for broker in brokers)
        log.info("npstream sink '%s' aborted batch %d: %d staging file(s) dropped",
                 sink_id, batch_id, dropped)
    except NpstreamError as exc:
        log.warning("npstream sink '%s' could not abort batch %d (the broker drops its "
                    "staging after sink_staging_ttl): %s", sink_id, batch_id, exc)


class _OptionsHolder:
    """What both writers keep: their checked options (pickled to the tasks)."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    @property
    def sink_id(self) -> str | None:
        return self.options.sink_id


class NpstreamStreamWriter(_OptionsHolder, DataSourceStreamArrowWriter):
    """Exactly-once micro-batch writer (``writeStream.format("npstream")``)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NpstreamCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context else None
        if batch_id is None or query_id is None:
            raise NoMicroBatchError(
                f"npstream sink: the task has no '{BATCH_ID_PROPERTY}' or "
                f"'{QUERY_ID_PROPERTY}' property; the streaming writer only runs inside a "
                "Structured Streaming micro-batch")
        options = self.options
        if options.sink_id is None:
            options = dataclasses.replace(options, sink_id=query_sink_id(query_id))
        return _stage_all(options, int(batch_id), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        _commit(self.options, batch_id, messages)

    def abort(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        _abort(self.options, batch_id, messages)


class NpstreamBatchWriter(_OptionsHolder, DataSourceArrowWriter):
    """All-or-nothing batch writer (``df.write.format("npstream")``): one commit per job."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NpstreamCommitMessage:
        return _stage_all(self.options, BATCH_WRITE_BATCH_ID, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self.options, BATCH_WRITE_BATCH_ID, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.options, BATCH_WRITE_BATCH_ID, messages)


def make_stream_writer(options: dict[str, str], schema: Any) -> NpstreamStreamWriter:
    """The streaming writer for a query (options, schema and target checked here, on the driver)."""
    checked = parse_write_options(options, schema, "stream")
    check_write_target(checked)
    _check_checkpoint(checked)
    return NpstreamStreamWriter(checked)


def _check_checkpoint(options: WriteOptions) -> None:
    """Refuse a checkpoint that never planned the broker's last batch of the sink.

    Spark creates the writer when the query starts and again for each commit;
    either way the checkpoint has planned every batch the sink committed.
    """
    from npstream.sink.client import SinkClient

    directory = checkpoint_dir(options.checkpoint) if options.checkpoint else None
    if options.sink_id is None or directory is None or not directory.is_dir():
        return
    assert options.checkpoint is not None
    with options.connection.connect() as client:
        committed = SinkClient(client).last_batch_id(options.sink_id)
        check_planned_batches(options.sink_id, options.checkpoint, directory, committed,
                              client.address)


def make_batch_writer(options: dict[str, str], schema: Any,
                      overwrite: bool) -> NpstreamBatchWriter:
    """The batch writer for one job, under a fresh sink id (one all-or-nothing commit)."""
    sink_id = f"batch-{uuid.uuid4().hex}"
    checked = parse_write_options(options, schema, "batch", overwrite=overwrite,
                                  batch_sink_id=sink_id)
    check_write_target(checked)
    return NpstreamBatchWriter(checked)

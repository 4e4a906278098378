"""The ``npstream`` Spark data source: format name, schema, readers and writers.

Spark creates this class in a Python worker with the user's options, pickles
it, and calls ``streamReader``/``reader``/``streamWriter``/``writer`` in other
workers when the query is planned. So the class stays light: options are
validated where the reader or writer is built (the query fails at start
with a clear message), and heavy imports (grpc, the client, the writer) happen
inside the methods that need them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from npstream.errors import NpstreamError
from npstream.spark.options import (
    InvalidOptionError,
    ReadMode,
    ReadOptions,
    check_known_options,
    check_read_options,
    parse_read_options,
)

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter

    from npstream.spark.read_schema import ReadSchema

__all__ = ["FORMAT", "NpstreamDataSource"]

FORMAT = "npstream"

T = TypeVar("T")


# Spark's switch (set by spark.sql.execution.pyspark.udf.hideTraceback.enabled) that
# makes a Python worker report an error as its message alone, without the frames.
HIDE_TRACEBACK_ENV = "SPARK_HIDE_TRACEBACK"


def _in_spark_worker() -> bool:
    """True in a Python process Spark started (planner, daemon or worker), never in the
    user's own driver process or a test calling the data source directly."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return bool(spec is not None and str(spec.name).startswith("pyspark."))


def _message_first(call: Callable[[], T], *, hide_frames: bool = True) -> T:
    """``call()``, with an npstream error shown by Spark as its message alone.

    Spark reports an error of a Python data source as its prefix
    ("[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance:")
    and the Python traceback text, in which the message comes last, under
    some fifteen lines of frames. Our errors are meant for the user: in a
    Spark worker, which reports the error and exits, Spark's own switch to
    hide the frames is turned on first, so the message follows the prefix.
    Elsewhere the error is raised without its inner frames.

    ``hide_frames=False`` where Spark's own code raises again while handling
    our error (its streaming source runner stops a reader it failed to
    create: an UnboundLocalError), since the message alone would then be
    that error's; the traceback keeps ours as the first exception.
    """
    try:
        return call()
    except NpstreamError as exc:
        if hide_frames and _in_spark_worker():
            os.environ.setdefault(HIDE_TRACEBACK_ENV, "1")
        raise exc.with_traceback(None) from None


class NpstreamDataSource(DataSource):
    """Read and write npstream streams from Spark, streaming or batch.

    Name: ``npstream``

    Schema (reads): ``stream string, offset long, id string, key binary,
    value binary, timestamp timestamp`` plus ``headers map<string,binary>``
    with ``includeHeaders=true``. Typed streams (docs/typed-streams.md) have
    no binary ``value``: ``stream, offset, id, key, timestamp[, headers]``
    followed by the value schema's fields as columns (valueColumns=flatten) or
    by one ``value`` struct (valueColumns=struct). The broker is asked at
    ``load()`` which streams are typed; streams read together must be all
    untyped, or all typed with the same fields and types.

    Read options (names are case-insensitive; see docs/spark.md)
    ------------------------------------------------------------
    Generated from the option table (npstream.spark.options, READ_SPECS):
    edit the table, then run ``make docs``.

    .. begin generated: read options (`make docs`; do not edit)
    broker : str, default env NPSTREAM_BROKER, else localhost:7070
        Broker address (host:port or a gRPC target: dns:, unix:, ipv4:,
        ipv6:, vsock:), checked by the rule Client(address) uses.
    token : str, optional
        Auth token, sent as authorization: Bearer <token>.
    tls : bool, default false
        Connect with TLS (system CA roots unless tlsRootCertificates).
    tlsRootCertificates : str, optional
        PEM file of CA certificates to trust; implies tls=true. Read on the
        driver and shipped to tasks, so executors need no copy of the file.
    tlsClientCertificate : str, optional
        PEM client certificate, for a broker that requires one
        (tls_client_ca_file, mutual TLS); needs tlsClientKey, implies
        tls=true.
    tlsClientKey : str, optional
        PEM private key of tlsClientCertificate. Both files are read on the
        driver and shipped to tasks with the plan, like the token: executors
        need no copy, and whoever can read the query's plan can read the
        key.
    stream : str, optional
        One stream or a comma-separated list.
    streamPattern : str, optional
        Every stream whose name matches the glob (*, ?, [...],
        case-sensitive).
    startingOffsets : str, default latest (streaming), earliest (batch)
        Where a new query starts.
    startingTimestamp : str, optional
        Start at the first message with timestamp >= this (ISO-8601, UTC
        when no offset, or epoch ms).
    endingOffsets : str, default "latest" (batch only)
        Exclusive end of a batch read.
    endingTimestamp : str, optional (batch only)
        A batch read stops before the first message with timestamp >= this.
    maxOffsetsPerTrigger : int, optional (streaming only)
        At most about this many messages per micro-batch.
    minOffsetsPerTrigger : int, optional (streaming only)
        Do not start a batch until this many new messages are available, or
        maxTriggerDelay has passed since the last batch.
    maxTriggerDelay : str, default "15m" (streaming only)
        Longest time minOffsetsPerTrigger may hold back a batch after the
        last one.
    minPartitions : int, optional
        At least this many Spark partitions per batch.
    maxRecordsPerPartition : int, optional
        At most this many messages per Spark partition.
    defaultParallelism : int, default the planning host's CPUs
        Without minPartitions and maxRecordsPerPartition, a batch of at
        least 250,000 messages per partition is split into up to this many
        partitions; on a cluster pass spark.sparkContext.defaultParallelism.
    failOnDataLoss : bool, default true
        Fail when messages the query needs were removed by retention; false
        skips them with a warning (Data loss).
    group : str, optional
        Streaming: after each batch, record the processed position in this
        consumer group; batch: only with startingOffsets=group.
    includeHeaders : bool, default false
        Add the headers column.
    valueColumns : str, default "flatten"
        Typed streams: the value's fields as top-level columns (flatten) or
        one value struct column (struct); no effect on untyped streams
        (Typed streams).
    fetchMaxBytes : str, default "8MiB"
        Bytes per Fetch RPC (or local read step) made by a task (at most
        64MiB).
    localReads : bool, default true
        A task on the broker's machine reads the stored frames from the
        broker's segment files instead of over gRPC (see client.md, local
        reads); false: always gRPC.
    .. end generated: read options

    Write options (see docs/spark.md, section "Writer")
    ---------------------------------------------------
    The connection options broker, token, tls, tlsRootCertificates,
    tlsClientCertificate and tlsClientKey as for reads, and (generated from
    the option table npstream.spark.writer_options.WRITE_SPECS):

    .. begin generated: write options (`make docs`; do not edit)
    stream : str, optional
        Target stream (one name); overrides a stream column.
    sinkId : str, default query-<id>, the query's id in its checkpoint (streaming only)
        Name of the query's commit record on the broker
        ([A-Za-z0-9][A-Za-z0-9._-]{0,254}).
    stageBytes : str, default "8MiB"
        Arrow bytes per Stage request sent by a task (64KiB to 32MiB). Each
        request's staged file of at least the broker's sink_adopt_min_bytes
        becomes a segment of the target stream at commit, so larger requests
        mean fewer, larger segments (and two requests in flight per task
        cost twice this in task memory).
    createStream : bool, default false
        Create the stream option's stream when missing: typed with the
        DataFrame's schema for a typed write, untyped otherwise (Writing
        typed streams).
    localStaging : bool, default true
        A task on the broker's machine hands its rows over in a file of the
        broker's stage inbox instead of sending them over gRPC (checked by
        both sides; anything unusable falls back to gRPC). false: always
        gRPC (exactly-once.md).
    checkpointLocation : str, optional (streaming only)
        Set on the query as usual; the driver reads the query's id from it
        (the default sink id).
    queryName : str, optional (streaming only)
        Set by Spark; not used for the sink id.
    .. end generated: write options

    Examples
    --------
    >>> df = (spark.readStream.format("npstream")
    ...       .option("broker", "localhost:7070")
    ...       .option("stream", "orders")
    ...       .option("startingOffsets", "earliest")
    ...       .option("maxOffsetsPerTrigger", 10000)
    ...       .load())
    >>> query = (df.selectExpr("offset", "CAST(value AS STRING) AS value")
    ...          .writeStream.format("console")
    ...          .option("checkpointLocation", "/tmp/orders-ckpt").start())

    Batch read of a time window:

    >>> spark.read.format("npstream").option("stream", "orders") \\
    ...     .option("startingTimestamp", "2025-01-01T00:00:00Z") \\
    ...     .option("endingTimestamp", "2025-01-02T00:00:00Z").load().count()
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        # Spark calls schema() at load() of a read (never for writes), so read
        # options are checked here already and a typo fails on the load() line.
        # Whether the streams are typed is asked of the broker here, once; the
        # result travels with this (pickled) object to the readers, so the
        # query reads with the schema Spark planned.
        from npstream.spark.read_schema import resolve_read_schema

        read_schema = _message_first(lambda: resolve_read_schema(check_read_options(self.options)))
        self._read_schema = read_schema
        return read_schema.spark_schema()

    def _read_options(self, mode: ReadMode,
                      schema: StructType | None) -> tuple[ReadOptions, ReadSchema]:
        options = parse_read_options(self.options, mode)
        planned: ReadSchema | None = getattr(self, "_read_schema", None)
        if (planned is not None and planned.include_headers == options.include_headers
                and (schema is None or schema == planned.spark_schema())):
            return options, planned
        # A schema given with .schema(...) (Spark then never calls schema()).
        from npstream.spark.read_schema import resolve_read_schema

        expected = resolve_read_schema(options)
        if schema is not None and schema != expected.spark_schema():
            raise InvalidOptionError(
                f"The npstream source's schema is set by its streams "
                f"({expected.spark_schema().simpleString()}); got {schema.simpleString()}. "
                "Drop .schema(...) and select or cast columns after load() instead."
            )
        return options, expected

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from npstream.spark.stream_reader import NpstreamStreamReader

        options, read_schema = _message_first(lambda: self._read_options("stream", schema),
                                              hide_frames=False)
        return NpstreamStreamReader(options, schema=read_schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        from npstream.spark.batch_reader import (
            NpstreamBatchReader,
            NpstreamPushdownBatchReader,
            pushdown_requested,
        )

        options, read_schema = _message_first(lambda: self._read_options("batch", schema))
        if pushdown_requested():
            return NpstreamPushdownBatchReader(options, schema=read_schema)
        return NpstreamBatchReader(options, schema=read_schema)

    def _check_write_options(self) -> dict[str, str]:
        from npstream.spark.writer_options import WRITER_OPTIONS

        check_known_options(self.options, {name.lower(): name for name in WRITER_OPTIONS},
                            'the "npstream" sink')
        return {key.lower(): str(value) for key, value in self.options.items()}

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from npstream.spark.writer import make_stream_writer

        return _message_first(lambda: make_stream_writer(self._check_write_options(), schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from npstream.spark.writer import make_batch_writer

        return _message_first(
            lambda: make_batch_writer(self._check_write_options(), schema, overwrite))

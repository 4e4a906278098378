"""The ``npstream`` Spark data source: format name, schema, readers and writers.

Spark creates this class in a Python worker with the user's options, pickles
it, and calls ``streamReader``/``reader``/``streamWriter``/``writer`` in other
workers when the query is planned. So the class stays light: options are
validated where the reader or writer is built (the query fails at start
with a clear message), and heavy imports (grpc, the client, the writer) happen
inside the methods that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

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
    The defaults are those of the option table (npstream.spark.options,
    READ_SPECS); a test keeps this list in step with it.

    broker : str, default env NPSTREAM_BROKER, else "localhost:7070"
        Broker address (host:port or a gRPC target).
    token : str, optional
        Auth token.
    tls : bool, default false
        Use TLS.
    tlsRootCertificates : str, optional
        Path of a PEM file with the CA certificates to trust (implies tls).
    tlsClientCertificate : str, optional
        Path of a PEM client certificate, for brokers that require one (mutual
        TLS); needs tlsClientKey, implies tls.
    tlsClientKey : str, optional
        Path of the PEM private key of tlsClientCertificate.
    stream : str
        One stream or a comma-separated list. Exactly one of stream/streamPattern.
    streamPattern : str
        Glob; streams created later are read from their beginning.
    startingOffsets : str, default "latest" (streaming) / "earliest" (batch)
        earliest | latest | group | JSON ``{"orders": 42}`` (-2 earliest, -1 latest).
    startingTimestamp : str, optional
        ISO-8601 or epoch ms: start at the first message at or after it.
    endingOffsets : str, default "latest" (batch only)
        latest | JSON ``{"orders": 100}`` (exclusive, -1 latest).
    endingTimestamp : str, optional (batch only)
        Stop before the first message at or after this time.
    maxOffsetsPerTrigger : int, optional
        At most this many messages per micro-batch, shared fairly by streams.
    minOffsetsPerTrigger : int, optional
        Wait for this many new messages, at most maxTriggerDelay.
    maxTriggerDelay : str, default "15m"
        Longest delay minOffsetsPerTrigger may cause.
    minPartitions : int, optional
        At least this many Spark partitions per batch.
    maxRecordsPerPartition : int, optional
        At most this many messages per Spark partition.
    failOnDataLoss : bool, default true
        Fail when needed messages were removed; false skips them with a warning.
    group : str, optional
        Record the position in this group after each batch (streaming);
        the group read by startingOffsets=group.
    includeHeaders : bool, default false
        Add the headers column.
    valueColumns : str, default "flatten"
        Typed streams: flatten (the value's fields as top-level columns) |
        struct (one 'value' struct column). No effect on untyped streams.
    fetchMaxBytes : str, default "8MiB"
        Bytes per Fetch RPC (or local read step) made by a task, at most 64MiB.
    localReads : bool, default true
        Tasks on the broker's machine read its segment files directly
        (checked, with gRPC as the fallback); false: always over gRPC.

    Write options (see docs/spark.md, section "Writer")
    ---------------------------------------------------
    The connection options broker, token, tls, tlsRootCertificates,
    tlsClientCertificate and tlsClientKey as for reads, and (option table:
    npstream.spark.writer_options, WRITE_SPECS):

    stream : str, optional
        Target stream; overrides a 'stream' column, without it every row
        needs a non-null 'stream' column value.
    sinkId : str, optional (streaming only)
        Name of the sink's commit record on the broker; default derived from
        checkpointLocation (else queryName).
    stageBytes : str, default "8MiB"
        Arrow bytes per Stage request sent by a task (64KiB to 32MiB).
    createStream : bool, default false
        Create the target stream when it does not exist: typed with the
        data's schema for a typed write (no 'value' column, or a struct one),
        untyped otherwise.
    localStaging : bool, default true
        Tasks on the broker's machine hand their rows over in a file of the
        broker's stage inbox (checked, with gRPC as the fallback).
    checkpointLocation : str, set by Spark (streaming only)
        The query's checkpoint; gives the default sink id.
    queryName : str, set by Spark (streaming only)
        The query's name; the default sink id without a checkpointLocation.

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

        options = check_read_options(self.options)
        read_schema = resolve_read_schema(options)
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

        options, read_schema = self._read_options("stream", schema)
        return NpstreamStreamReader(options, schema=read_schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        from npstream.spark.batch_reader import (
            NpstreamBatchReader,
            NpstreamPushdownBatchReader,
            pushdown_requested,
        )

        options, read_schema = self._read_options("batch", schema)
        if pushdown_requested():
            return NpstreamPushdownBatchReader(options, schema=read_schema)
        return NpstreamBatchReader(options, schema=read_schema)

    def _check_write_options(self) -> dict[str, str]:
        from npstream.spark.writer_options import WRITER_OPTIONS

        check_known_options(self.options, {name.lower(): name for name in WRITER_OPTIONS},
                            'the "npstream" sink')
        return {key.lower(): str(value) for key, value in self.options.items()}

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = self._check_write_options()
        from npstream.spark.writer import make_stream_writer

        return make_stream_writer(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = self._check_write_options()
        from npstream.spark.writer import make_batch_writer

        return make_batch_writer(options, schema, overwrite)

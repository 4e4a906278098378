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
    READ_OPTIONS,
    InvalidOptionError,
    ReadMode,
    ReadOptions,
    check_known_options,
    check_read_options,
    parse_read_options,
    table_default,
)
from npstream.spark.range_reader import spark_read_schema

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter

__all__ = ["FORMAT", "NpstreamDataSource"]

FORMAT = "npstream"


class NpstreamDataSource(DataSource):
    """Read and write npstream streams from Spark, streaming or batch.

    Name: ``npstream``

    Schema (reads): ``stream string, offset long, id string, key binary,
    value binary, timestamp timestamp`` plus ``headers map<string,binary>``
    with ``includeHeaders=true``.

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
    fetchMaxBytes : str, default "8MiB"
        Bytes per Fetch RPC (or local read step) made by a task, at most 64MiB.
    localReads : bool, default true
        Tasks on the broker's machine read its segment files directly
        (checked, with gRPC as the fallback); false: always over gRPC.

    Write options (see docs/spark.md, section "Writer")
    ---------------------------------------------------
    The connection options broker, token, tls and tlsRootCertificates as for
    reads, and (option table: npstream.spark.writer_options, WRITE_SPECS):

    stream : str, optional
        Target stream; overrides a 'stream' column, without it every row
        needs a non-null 'stream' column value.
    sinkId : str, optional (streaming only)
        Name of the sink's commit record on the broker; default derived from
        checkpointLocation (else queryName).
    stageBytes : str, default "8MiB"
        Arrow bytes per Stage request sent by a task (64KiB to 32MiB).
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
        check_read_options(self.options)
        lowered = {key.lower(): str(value) for key, value in self.options.items()}
        raw = lowered.get("includeheaders")
        return spark_read_schema(READ_OPTIONS["includeheaders"].parse(raw) if raw is not None
                                 else table_default(READ_OPTIONS, "includeHeaders"))

    def _read_options(self, mode: ReadMode, schema: StructType) -> ReadOptions:
        options = parse_read_options(self.options, mode)
        expected = spark_read_schema(options.include_headers)
        if schema is not None and schema != expected:
            raise InvalidOptionError(
                f"The npstream source has a fixed schema ({expected.simpleString()}); got "
                f"{schema.simpleString()}. Drop .schema(...) and select or cast columns after "
                "load() instead."
            )
        return options

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from npstream.spark.stream_reader import NpstreamStreamReader

        return NpstreamStreamReader(self._read_options("stream", schema))

    def reader(self, schema: StructType) -> DataSourceReader:
        from npstream.spark.batch_reader import (
            NpstreamBatchReader,
            NpstreamPushdownBatchReader,
            pushdown_requested,
        )

        options = self._read_options("batch", schema)
        if pushdown_requested():
            return NpstreamPushdownBatchReader(options)
        return NpstreamBatchReader(options)

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

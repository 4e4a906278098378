#!/usr/bin/env python3
"""Spark connector benchmark: streaming read and exactly-once write rows/s, local[2].

    .venv/bin/python bench/spark.py                   # 10,000,000 messages (4-10 min on 2 cores)
    .venv/bin/python bench/spark.py --quick           # 200,000 rows, a smoke run

Read: ``--rows`` messages of ``--size`` bytes are published to a fresh stream on our broker
(not timed), then read with ``readStream.format("npstream")`` and Trigger.AvailableNow into
the noop sink, versus (a) the same rows, in the same schema and batch size, emitted by a
tiny in-process Python data source that yields ready-made Arrow batches (the ceiling for
any Python source) and (b) Spark's rate-micro-batch source (JVM, for scale).

Write: ``--rows`` rows with one ``value`` column of ``--size`` bytes go to the noop sink
and to ``writeStream.format("npstream")`` (the exactly-once writer), from two inputs: the
ceiling source (near-free, so the ratio isolates the sink) and the npstream read of the
source stream (a stream-to-stream copy). Each target stream must then hold exactly
``--rows`` messages. For both inputs, a Python sink that only iterates its batches (the
floor of any Python sink given that input) is measured too, for reference.

rows/s = rows / the summed ``triggerExecution`` time of the query's micro-batches (Spark's
own progress figures, so query start-up, equal for every source, is left out); wall-clock
rows/s from start() to termination is printed beside it. A small warm-up query of every
kind runs first (JIT, Python workers). Goals: read >= 70% of (a); write >= 50% of noop.

Parallel by default (issue 32; --parallel-only runs nothing else): the same ``--rows``
messages read with ``spark.read`` and no options (the default split: up to the planning
host's CPUs, local[2] here) vs ``minPartitions=1`` (one task, the old default), into
the noop sink, --repeats rounds round-robin, median wall time of each action.

Typed streams (issue 17; --skip-typed leaves it out, --typed-only runs nothing else):
--typed-rows rows (1,000,000) of 5 columns (bench/typed_rows.py: sensorId STRING,
reading DOUBLE, ts TIMESTAMP, seq BIGINT, ok BOOLEAN) go into a typed stream and, as
JSON objects in bytes, into an untyped stream (not timed). Then batch reads
(``spark.read``, minPartitions 2) into the noop sink, one untimed round and then
--typed-repeats rounds (median of the wall time of each action): the typed stream's
read (the fields as columns) vs the untyped read (binary JSON value, not parsed), goal
typed <= 1.1x the time; and end to end, ``groupBy(window(ts, "1 minute"), sensorId)
.agg(avg(reading), count)`` on the typed columns vs the same on ``from_json(value as
string)`` of the untyped stream, goal typed faster. Untimed checks: both reads return
every row and both aggregations give the same groups, counts and averages.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from bench_common import (
    BrokerUnderTest,
    cpu_between,
    create_bench_stream,
    descendants_cpu,
    machine_info,
    proc_cpu_s,
)
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType
from report import Goal, fmt, render_goals, render_table, write_json
from typed_rows import DDL as TYPED_DDL
from typed_rows import json_values, typed_table

from npstream.spark.partitioning import AUTO_SPLIT_MIN_ROWS

# ---------------------------------------------------------------- tuning / run sizes
ROWS = 10_000_000
QUICK_ROWS = 200_000
SIZE = 100                     # payload bytes per message
BATCH_ROWS = 10_000            # rows per published table = per ready-made Arrow batch
PARTITION_ROWS = 1_000_000     # maxRecordsPerPartition for npstream and the ceiling source
WARMUP_ROWS = 50_000           # per warm-up query (not reported)
REPEATS = 3                    # timed runs per query (median): the 2 cores are shared
GOAL_READ_SHARE = 0.70         # npstream read >= 70% of the ceiling source
GOAL_WRITE_SHARE = 0.50        # npstream write >= 50% of the noop sink
# Typed streams (issue 17): rows of 5 columns, timed runs of each batch query (round-robin,
# median), partitions per batch read (one per core of local[2]), the aggregation's window.
TYPED_ROWS = 1_000_000
QUICK_TYPED_ROWS = 200_000
TYPED_REPEATS = 7
TYPED_PARTITIONS = 2
TYPED_WINDOW = "1 minute"
GOAL_TYPED_READ_X = 1.1        # typed batch read time <= 1.1x the untyped read's
CEILING_FORMAT = "bench_arrow_ceiling"
NULL_SINK_FORMAT = "bench_python_null_sink"


# ---------------------------------------------------------------- the ceiling source
# Defined here, self-contained: Spark pickles these classes by value (this file runs as
# __main__), so workers need nothing but pyarrow/pyspark to run them.

class _Range(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


class ArrowCeilingSource(DataSource):
    """Emits ``rows`` rows of a given schema from one ready-made Arrow batch, repeated.

    Options: ``schema`` (Spark StructType JSON), ``rows``, ``batchRows``, ``partitionRows``,
    ``size`` (bytes of every binary value). No I/O and no per-row work: whatever the
    npstream reader loses against it is the cost of fetching and decoding.
    """

    @classmethod
    def name(cls) -> str:
        return CEILING_FORMAT

    def schema(self) -> StructType:
        return StructType.fromJson(json.loads(self.options["schema"]))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        # Spark lower-cases option keys on their way here.
        return _CeilingStreamReader(dict(self.options), schema)


class _CeilingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.schema = schema
        self.rows = int(options["rows"])
        self.batch_rows = int(options["batchrows"])
        self.partition_rows = int(options["partitionrows"])
        self.size = int(options["size"])

    def initialOffset(self) -> dict:
        return {"offset": 0}

    def latestOffset(self, start: dict, limit: Any) -> dict:
        return {"offset": self.rows}

    def prepareForTriggerAvailableNow(self) -> None:
        """Nothing to pin: the end is fixed at ``rows``."""

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        lo, hi = start["offset"], end["offset"]
        return [_Range(s, min(s + self.partition_rows, hi))
                for s in range(lo, hi, self.partition_rows)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        batch = _ready_batch(self.schema, self.batch_rows, self.size)
        pos = partition.start
        while pos < partition.end:
            k = min(self.batch_rows, partition.end - pos)
            yield batch if k == self.batch_rows else batch.slice(0, k)
            pos += k

    def commit(self, end: dict) -> None:
        """Nothing to acknowledge."""


def _ready_batch(schema: StructType, n: int, size: int) -> pa.RecordBatch:
    """One batch of ``n`` rows in ``schema``: binary values of ``size`` random bytes."""
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(schema, timezone="UTC")
    payload = os.urandom(size)
    arrays = []
    for field in arrow:
        t = field.type
        if field.name == "offset" and pa.types.is_integer(t):
            arr = pa.array(range(n), type=t)
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            arr = pa.array([payload] * n, type=t)
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            arr = pa.array([f"{uuid.uuid4().hex}" for _ in range(n)], type=t)
        elif pa.types.is_timestamp(t):
            now = int(time.time() * 1e6)
            arr = pa.array([now] * n, type=pa.int64()).cast(t)
        elif pa.types.is_integer(t):
            arr = pa.array([0] * n, type=t)
        elif field.nullable:
            arr = pa.nulls(n, type=t)
        elif pa.types.is_map(t) or pa.types.is_list(t):
            arr = pa.array([[] for _ in range(n)], type=t)
        else:
            raise TypeError(f"ceiling source cannot fill non-nullable column {field}")
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=arrow)


# ---------------------------------------------------------------- the Python null sink
# The floor of any Python Arrow sink: it receives every batch in its Python worker, like
# the npstream sink, and does nothing with it. The difference to the noop sink (JVM) is
# the cost of handing rows to Python, which no Python sink can avoid.

class PythonNullSink(DataSource):
    """A streaming sink that iterates its Arrow batches in Python and keeps nothing."""

    @classmethod
    def name(cls) -> str:
        return NULL_SINK_FORMAT

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return _NullArrowWriter()


class _NullArrowWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        for _batch in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        """Nothing to make visible."""

    def abort(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        """Nothing to drop."""


# ---------------------------------------------------------------- runs

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, help=f"messages/rows (default {ROWS:,}; --quick "
                   f"{QUICK_ROWS:,})")
    p.add_argument("--size", type=int, default=SIZE, help=f"payload bytes (default {SIZE})")
    p.add_argument("--repeats", type=int, help=f"timed runs of each query, round-robin; the "
                   f"median is reported (default {REPEATS}; --quick 1)")
    p.add_argument("--quick", action="store_true", help="small counts for a smoke run")
    p.add_argument("--typed-rows", type=int, help=f"rows of the typed-stream section "
                   f"(default {TYPED_ROWS:,}; --quick {QUICK_TYPED_ROWS:,})")
    p.add_argument("--typed-repeats", type=int, help=f"timed runs of each typed-stream "
                   f"query, round-robin, median reported (default {TYPED_REPEATS}; --quick 1)")
    p.add_argument("--skip-typed", action="store_true",
                   help="leave out the typed-stream section")
    p.add_argument("--typed-only", action="store_true",
                   help="run only the typed-stream section")
    p.add_argument("--parallel-only", action="store_true",
                   help="run only the parallel-by-default batch read section")
    p.add_argument("--json", metavar="PATH", help="also write the raw results here")
    a = p.parse_args(argv)
    a.rows = a.rows or (QUICK_ROWS if a.quick else ROWS)
    a.repeats = a.repeats or (1 if a.quick else REPEATS)
    a.typed_rows = a.typed_rows or (QUICK_TYPED_ROWS if a.quick else TYPED_ROWS)
    a.typed_repeats = a.typed_repeats or (1 if a.quick else TYPED_REPEATS)
    if a.rows < 1 or a.size < 1 or a.repeats < 1:
        p.error("--rows, --size and --repeats must be >= 1")
    if a.typed_rows < 1 or a.typed_repeats < 1:
        p.error("--typed-rows and --typed-repeats must be >= 1")
    if a.parallel_only and a.typed_only:
        p.error("--parallel-only and --typed-only exclude each other")
    if a.typed_only and a.skip_typed:
        p.error("--typed-only and --skip-typed exclude each other")
    return a


def make_spark() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]").appName("npstream-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(ArrowCeilingSource)
    spark.dataSource.register(PythonNullSink)
    # Editable (development) installs are invisible to Spark's pyspark_* discovery.
    from npstream.spark import register

    register(spark, filter_pushdown=False)
    return spark


def run_query(df: Any, sink: str, options: dict[str, str], work: str) -> dict[str, Any]:
    """Run one AvailableNow query into ``sink``; rows and times from Spark's progress."""
    checkpoint = tempfile.mkdtemp(prefix="ckpt-", dir=work)
    writer = df.writeStream.format(sink).trigger(availableNow=True)
    writer = writer.option("checkpointLocation", checkpoint)
    for key, value in options.items():
        writer = writer.option(key, value)
    t0 = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    wall = time.perf_counter() - t0
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    batch_s = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    shutil.rmtree(checkpoint, ignore_errors=True)
    return {"rows": rows, "micro_batches": len(progress), "batch_seconds": round(batch_s, 3),
            "wall_seconds": round(wall, 3),
            "rows_per_s": round(rows / batch_s, 1) if batch_s else None,
            "wall_rows_per_s": round(rows / wall, 1) if wall else None}


def interleaved(a: argparse.Namespace,
                queries: list[tuple[str, str, Any]]) -> dict[str, dict[str, Any]]:
    """Run every query ``--repeats`` times, round-robin, and keep the medians.

    Round-robin rather than one query's repeats in a row, so that a burst of other load
    on the shared machine hits the queries being compared alike.
    """
    runs: dict[str, list[dict[str, Any]]] = {key: [] for key, _label, _fn in queries}
    for i in range(a.repeats):
        for key, label, fn in queries:
            print(f"# {label} (run {i + 1}/{a.repeats})", file=sys.stderr)
            runs[key].append(fn())
    out = {}
    for key, label, _fn in queries:
        done = runs[key]
        medians = {k: statistics.median(r[k] for r in done) for k in
                   ("rows_per_s", "wall_rows_per_s") if all(r[k] for r in done)}
        out[key] = {"label": label, "runs": done, **medians,
                    "rows": min(r["rows"] for r in done)}
    return out


def fill_stream(client: Any, stream: str, rows: int, size: int) -> float:
    payload = os.urandom(size)
    table = pa.table({"value": pa.array([payload] * min(BATCH_ROWS, rows), type=pa.binary())})
    t0 = time.perf_counter()
    sent = 0
    while sent < rows:
        k = min(table.num_rows, rows - sent)
        client.publish_batch(stream, table.slice(0, k), ack="write")
        sent += k
    return time.perf_counter() - t0


# Inputs of the write benchmark: (key, label). Each feeds the noop sink, the npstream
# sink and the Python null sink; "ceiling" isolates the sink (near-free Python input),
# "npstream" is a stream-to-stream copy (input = the npstream read of the source stream).
WRITE_INPUTS = [("ceiling", "value rows from the ceiling source"),
                ("npstream", "value column of the npstream read")]


def run_benchmarks(a: argparse.Namespace, spark: Any, broker: BrokerUnderTest, client: Any,
                   work: str) -> dict[str, Any]:
    src = f"bench-spark-{uuid.uuid4().hex[:8]}"
    warm = f"bench-warm-{uuid.uuid4().hex[:8]}"
    for name, n in ((src, a.rows), (warm, min(WARMUP_ROWS, a.rows))):
        create_bench_stream(client, name)
        print(f"# publishing {n:,} x {a.size} B to {name}", file=sys.stderr)
        fill_stream(client, name, n, a.size)

    def npstream_df(stream: str) -> Any:
        return (spark.readStream.format("npstream").option("broker", broker.address)
                .option("stream", stream).option("startingOffsets", "earliest")
                .option("maxRecordsPerPartition", str(PARTITION_ROWS)).load())

    def ceiling_df(schema: StructType, rows: int) -> Any:
        return (spark.readStream.format(CEILING_FORMAT)
                .option("schema", schema.json()).option("rows", str(rows))
                .option("batchRows", str(BATCH_ROWS))
                .option("partitionRows", str(PARTITION_ROWS))
                .option("size", str(a.size)).load())

    def rate_df(rows: int) -> Any:
        return (spark.readStream.format("rate-micro-batch")
                .option("rowsPerBatch", str(rows)).option("numPartitions", "2").load())

    read_schema = npstream_df(src).schema
    value_schema = StructType.fromDDL("value BINARY")

    def write_input(kind: str, stream: str, rows: int) -> Any:
        if kind == "ceiling":
            return ceiling_df(value_schema, rows)
        return npstream_df(stream).select("value")

    def to_npstream(df: Any, stream: str) -> dict[str, Any]:
        return run_query(df, "npstream", {"broker": broker.address, "stream": stream}, work)

    print("# warm-up queries", file=sys.stderr)
    run_query(npstream_df(warm), "noop", {}, work)
    run_query(ceiling_df(read_schema, WARMUP_ROWS), "noop", {}, work)
    run_query(rate_df(WARMUP_ROWS), "noop", {}, work)
    for kind, _label in WRITE_INPUTS:
        warm_out = f"bench-sink-warm-{uuid.uuid4().hex[:8]}"
        create_bench_stream(client, warm_out)
        to_npstream(write_input(kind, warm, WARMUP_ROWS), warm_out)
        run_query(write_input(kind, warm, WARMUP_ROWS), NULL_SINK_FORMAT, {}, work)

    results: dict[str, Any] = interleaved(a, [
        ("read_npstream", "npstream -> noop",
         lambda: run_query(npstream_df(src), "noop", {}, work)),
        ("read_ceiling", "ceiling Python source -> noop",
         lambda: run_query(ceiling_df(read_schema, a.rows), "noop", {}, work)),
        ("read_rate", "rate-micro-batch -> noop",
         lambda: run_query(rate_df(a.rows), "noop", {}, work)),
    ])
    for kind, label in WRITE_INPUTS:
        out = f"bench-sink-{kind}-{uuid.uuid4().hex[:8]}"
        create_bench_stream(client, out)
        queries = [
            (f"write_noop_{kind}", f"{label} -> noop",
             lambda kind=kind: run_query(write_input(kind, src, a.rows), "noop", {}, work)),
            (f"write_npstream_{kind}", f"{label} -> npstream sink",
             lambda kind=kind, out=out: to_npstream(write_input(kind, src, a.rows), out)),
            # The floor of any Python sink with this input, for reading the ratio.
            (f"write_pynull_{kind}", f"{label} -> Python null sink",
             lambda kind=kind: run_query(write_input(kind, src, a.rows),
                                         NULL_SINK_FORMAT, {}, work)),
        ]
        results.update(interleaved(a, queries))
        written = results[f"write_npstream_{kind}"]
        written["stream_messages_added"] = client.stream_info(out).end_offset
        written["exact"] = written["stream_messages_added"] == a.rows * a.repeats
    results["source_stream"] = src
    return results


def build_report(a: argparse.Namespace, results: dict[str, Any]) -> tuple[str, list[Goal]]:
    ceiling = results["read_ceiling"].get("rows_per_s")
    lines: list[tuple[str, str, float | None]] = [
        ("read_npstream", "read: npstream source (AvailableNow) -> noop", ceiling),
        ("read_ceiling", "read: (a) ceiling Python source, ready Arrow batches -> noop", ceiling),
        ("read_rate", "read: (b) rate-micro-batch (JVM) -> noop", ceiling),
    ]
    for kind, label in WRITE_INPUTS:
        noop = results[f"write_noop_{kind}"].get("rows_per_s")
        lines += [(f"write_noop_{kind}", f"write: {label} -> noop sink", noop),
                  (f"write_npstream_{kind}", f"write: {label} -> npstream sink", noop),
                  (f"write_pynull_{kind}", f"write: {label} -> Python null sink (floor)", noop)]
    rows = []
    for key, what, vs in lines:
        r = results[key]
        share = f"{r['rows_per_s'] / vs:.0%}" if r.get("rows_per_s") and vs else "-"
        rows.append([what, fmt(r["rows"]), fmt(r.get("rows_per_s")),
                     fmt(r.get("wall_rows_per_s")), share])

    def share_goal(name: str, ours: float | None, base: float | None, need: float) -> Goal:
        if not ours or not base:
            return Goal(name, None, "not measured")
        return Goal(name, ours >= need * base,
                    f"{ours / base:.0%} ({fmt(ours)} vs {fmt(base)} rows/s)")

    goals = [share_goal(f"read >= {GOAL_READ_SHARE:.0%} of the ceiling Python source",
                        results["read_npstream"].get("rows_per_s"), ceiling, GOAL_READ_SHARE)]
    for kind, label in WRITE_INPUTS:
        goals.append(share_goal(
            f"write >= {GOAL_WRITE_SHARE:.0%} of the noop sink (input: {label})",
            results[f"write_npstream_{kind}"].get("rows_per_s"),
            results[f"write_noop_{kind}"].get("rows_per_s"), GOAL_WRITE_SHARE))
    goals.append(Goal(f"every query processed all {a.rows:,} rows",
                      all(run["rows"] == a.rows for r in results.values() for run in r["runs"]),
                      ", ".join(f"{k}: {r['rows']:,}" for k, r in results.items())))
    for kind, _label in WRITE_INPUTS:
        w = results[f"write_npstream_{kind}"]
        goals.append(Goal(f"npstream sink wrote every row exactly once (input: {kind})",
                          w["exact"], f"{w['stream_messages_added']:,} messages in the target "
                          f"stream for {a.rows * a.repeats:,} rows"))
    text = "\n".join([
        render_table(["query", "rows", "rows/s", "wall rows/s", "share"], rows),
        "rows/s: rows / summed micro-batch time (Spark progress); share: of (a) for reads, "
        "of the noop sink with the same input for writes",
    ])
    return text, goals


# ---------------------------------------------------------------- typed streams (issue 17)

# (key, label, baseline key) in the round-robin order of every repeat.
TYPED_QUERIES = [
    ("read_typed", "read: typed stream, the 5 fields as columns -> noop", "read_untyped"),
    ("read_untyped", "read: untyped stream, JSON value as binary, not parsed -> noop "
     "(baseline)", "read_untyped"),
    ("agg_typed", f"end to end: typed columns, groupBy(window(ts, {TYPED_WINDOW}), sensorId)"
     ".agg(avg(reading), count) -> noop", "agg_untyped"),
    ("agg_untyped", "end to end: untyped, from_json(value as string), the same aggregation "
     "-> noop (baseline)", "agg_untyped"),
]


def run_batch(df: Any, broker: BrokerUnderTest) -> dict[str, Any]:
    """One batch action: ``df`` written to the noop sink; its wall time, and the CPU
    seconds it took in Spark (the JVM and its Python workers: every process this script
    started except the broker) and in the broker."""
    spark0 = descendants_cpu(os.getpid(), exclude=[broker.pid or -1])
    broker0 = proc_cpu_s(broker.pid)
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - t0
    spark_cpu = cpu_between(spark0, descendants_cpu(os.getpid(), exclude=[broker.pid or -1]))
    broker1 = proc_cpu_s(broker.pid)
    return {"seconds": round(seconds, 4), "spark_cpu_s": round(spark_cpu, 2),
            "broker_cpu_s": round(broker1 - broker0, 2)
            if broker0 is not None and broker1 is not None else None}


def run_parallel(a: argparse.Namespace, spark: Any, broker: BrokerUnderTest,
                 stream: str) -> dict[str, Any]:
    """Batch read of ``stream`` with no options (the default split) vs minPartitions=1."""
    def read(**options: str) -> Any:
        reader = spark.read.format("npstream").option("broker", broker.address)
        for key, value in {"stream": stream, **options}.items():
            reader = reader.option(key, value)
        return reader.load()

    queries = {"default": {}, "one_task": {"minPartitions": "1"}}
    out: dict[str, Any] = {key: {"partitions": read(**o).rdd.getNumPartitions(), "runs": []}
                           for key, o in queries.items()}
    for options in queries.values():  # untimed round
        run_batch(read(**options), broker)
    for i in range(a.repeats):
        for key, options in queries.items():
            print(f"# parallel: {key} (run {i + 1}/{a.repeats})", file=sys.stderr)
            out[key]["runs"].append(run_batch(read(**options), broker))
    for result in out.values():
        result["seconds"] = statistics.median(r["seconds"] for r in result["runs"])
    return out


def parallel_report(a: argparse.Namespace, par: dict[str, Any]) -> tuple[str, list[Goal]]:
    base = par["one_task"]["seconds"]
    rows = [[what, str(par[key]["partitions"]), f"{par[key]['seconds']:.3f}",
             fmt(a.rows / par[key]["seconds"]), f"{base / par[key]['seconds']:.2f}x"]
            for key, what in (("default", "spark.read, no options (default split)"),
                              ("one_task", "spark.read, minPartitions=1 (one task)"))]
    speedup = base / par["default"]["seconds"]
    text = "\n".join([
        render_table(["batch read -> noop", "partitions", "seconds", "rows/s", "speedup"],
                     rows),
        f"median of {a.repeats} round(s), {a.rows:,} x {a.size} B"])
    detail = f"{par['default']['partitions']} partitions, {speedup:.2f}x the one-task read"
    if a.rows < 2 * AUTO_SPLIT_MIN_ROWS:  # below the split threshold one task is the design
        goals = [Goal("a large batch read uses every core of local[2] with no options", None,
                      f"{detail}; not judged below {2 * AUTO_SPLIT_MIN_ROWS:,} rows")]
    else:
        goals = [Goal("a large batch read uses every core of local[2] with no options",
                      par["default"]["partitions"] >= 2 and speedup > 1, detail)]
    return text, goals


def run_typed(a: argparse.Namespace, spark: Any, broker: BrokerUnderTest,
              client: Any) -> dict[str, Any]:
    """Typed vs untyped (JSON) batch reads and end-to-end aggregations, same rows."""
    from pyspark.sql import functions as F

    n = a.typed_rows
    value_schema = StructType.fromDDL(TYPED_DDL)
    suffix = uuid.uuid4().hex[:8]
    streams = {"typed": f"bench-typed-{suffix}", "untyped": f"bench-json-{suffix}"}
    print(f"# typed streams: building {n:,} rows x 5 columns as a struct and as JSON",
          file=sys.stderr)
    tables = {"typed": typed_table(n), "untyped": pa.table({"value": json_values(n)})}
    fill_s = {}
    for kind, name in streams.items():
        create_bench_stream(client, name, schema=TYPED_DDL if kind == "typed" else None)
        print(f"# typed streams: publishing {n:,} rows to {name}", file=sys.stderr)
        t0 = time.perf_counter()
        client.publish_batch(name, tables[kind], ack="write")
        fill_s[name] = round(time.perf_counter() - t0, 3)

    def read(stream: str) -> Any:
        return (spark.read.format("npstream").option("broker", broker.address)
                .option("stream", stream).option("minPartitions", str(TYPED_PARTITIONS))
                .load())

    def aggregate(df: Any) -> Any:
        return (df.groupBy(F.window("ts", TYPED_WINDOW), "sensorId")
                .agg(F.avg("reading").alias("avg_reading"), F.count("*").alias("n")))

    def parsed(df: Any) -> Any:
        return (df.select(F.from_json(F.col("value").cast("string"), value_schema).alias("v"))
                .select("v.*"))

    frames = {
        "read_typed": lambda: read(streams["typed"]),
        "read_untyped": lambda: read(streams["untyped"]),
        "agg_typed": lambda: aggregate(read(streams["typed"])),
        "agg_untyped": lambda: aggregate(parsed(read(streams["untyped"]))),
    }
    # One untimed round: the first full-size query of each kind is up to 2x slower
    # (JIT, the streams' first reads), which would otherwise fall on the first round.
    print("# typed streams: warm-up round (not timed)", file=sys.stderr)
    for key, _label, _base in TYPED_QUERIES:
        run_batch(frames[key](), broker)
    runs: dict[str, list[dict[str, Any]]] = {key: [] for key, _l, _b in TYPED_QUERIES}
    for i in range(a.typed_repeats):
        for key, label, _base in TYPED_QUERIES:
            print(f"# typed streams: {label} (run {i + 1}/{a.typed_repeats})", file=sys.stderr)
            runs[key].append(run_batch(frames[key](), broker))
    results: dict[str, Any] = {}
    for key, label, _base in TYPED_QUERIES:
        seconds = statistics.median(r["seconds"] for r in runs[key])
        results[key] = {"label": label, "runs": runs[key], "seconds": seconds,
                        "rows_per_s": round(n / seconds, 1),
                        "spark_cpu_s": statistics.median(r["spark_cpu_s"] for r in runs[key]),
                        "broker_cpu_s": _median_or_none([r["broker_cpu_s"]
                                                         for r in runs[key]])}
    print("# typed streams: checks (row counts, aggregations compared)", file=sys.stderr)
    counts = {kind: frames[f"read_{kind}"]().count() for kind in ("typed", "untyped")}
    typed_groups = _agg_rows(frames["agg_typed"]().collect())
    untyped_groups = _agg_rows(frames["agg_untyped"]().collect())
    same = (typed_groups.keys() == untyped_groups.keys() and all(
        typed_groups[k][0] == untyped_groups[k][0]
        and math.isclose(typed_groups[k][1], untyped_groups[k][1], rel_tol=1e-12)
        for k in typed_groups))
    checks = {"read_rows": counts, "groups": len(typed_groups),
              "aggregated_rows": sum(c for c, _avg in typed_groups.values()),
              "aggregations_equal": same}
    for name in streams.values():
        client.delete_stream(name)
    return {"rows": n, "schema": TYPED_DDL, "repeats": a.typed_repeats,
            "partitions": TYPED_PARTITIONS, "streams": streams, "fill_seconds": fill_s,
            "results": results, "checks": checks}


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _agg_rows(rows: list[Any]) -> dict[tuple[Any, str], tuple[int, float]]:
    """(window start, sensorId) -> (count, average) of collected aggregation rows."""
    return {(r["window"]["start"], r["sensorId"]): (r["n"], r["avg_reading"]) for r in rows}


def typed_report(a: argparse.Namespace, typed: dict[str, Any]) -> tuple[str, list[Goal]]:
    n, res = typed["rows"], typed["results"]
    rows = []
    for key, label, base in TYPED_QUERIES:
        r = res[key]
        rows.append([label, f"{r['seconds']:.3f}", fmt(r["rows_per_s"]),
                     f"{r['seconds'] / res[base]['seconds']:.2f}x", f"{r['spark_cpu_s']:.2f}",
                     f"{r['spark_cpu_s'] / res[base]['spark_cpu_s']:.2f}x",
                     fmt(r["broker_cpu_s"], 2)])
    text = "\n".join([
        f"typed streams (issue 17): {n:,} rows x 5 columns ({typed['schema']}), batch reads "
        f"(spark.read, minPartitions {typed['partitions']}), median of {typed['repeats']} "
        "run(s), round-robin",
        render_table(["query", "seconds", "rows/s", "time vs untyped", "Spark CPU s",
                      "CPU vs untyped", "broker CPU s"], rows),
        "seconds: wall time of the action (df.write.format('noop').save()), planning "
        "included; vs untyped: over the untyped query of the same kind; Spark CPU: the JVM "
        "and its Python workers (all medians)",
    ])

    def per_round(key: str, base: str) -> str:
        ratios = [r["seconds"] / b["seconds"]
                  for r, b in zip(res[key]["runs"], res[base]["runs"], strict=True)]
        return f"per round {min(ratios):.2f}-{max(ratios):.2f}x"

    read_t, read_u = res["read_typed"]["seconds"], res["read_untyped"]["seconds"]
    agg_t, agg_u = res["agg_typed"]["seconds"], res["agg_untyped"]["seconds"]
    checks = typed["checks"]
    same = "equal" if checks["aggregations_equal"] else "DIFFER"
    goals = [
        Goal(f"typed batch read of {n:,} x 5 columns <= {GOAL_TYPED_READ_X:g}x the time of "
             "the untyped read (JSON value, not parsed)", read_t <= GOAL_TYPED_READ_X * read_u,
             f"{read_t / read_u:.2f}x ({read_t:.3f} s vs {read_u:.3f} s; "
             f"{per_round('read_typed', 'read_untyped')}; Spark CPU "
             f"{res['read_typed']['spark_cpu_s'] / res['read_untyped']['spark_cpu_s']:.2f}x)"),
        Goal("end to end (read + windowed aggregation): typed faster than untyped with "
             "from_json", agg_t < agg_u,
             f"{agg_u / agg_t:.2f}x faster ({agg_t:.3f} s vs {agg_u:.3f} s; time "
             f"{per_round('agg_typed', 'agg_untyped')})"),
        Goal(f"typed and untyped reads returned all {n:,} rows and the same aggregation",
             all(c == n for c in checks["read_rows"].values())
             and checks["aggregated_rows"] == n and checks["aggregations_equal"],
             f"rows read {checks['read_rows']['typed']:,} / {checks['read_rows']['untyped']:,}, "
             f"{checks['groups']:,} groups counting {checks['aggregated_rows']:,} rows, "
             f"groups, counts and averages {same}"),
    ]
    return text, goals


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from npstream import Client

    work = tempfile.mkdtemp(prefix="npstream-bench-spark-")
    spark = make_spark()
    results: dict[str, Any] = {}
    typed: dict[str, Any] | None = None
    parallel: dict[str, Any] | None = None
    try:
        with BrokerUnderTest() as broker, Client(broker.address) as client:
            if a.parallel_only:
                stream = f"bench-par-{uuid.uuid4().hex[:8]}"
                create_bench_stream(client, stream)
                print(f"# publishing {a.rows:,} x {a.size} B to {stream}", file=sys.stderr)
                fill_stream(client, stream, a.rows, a.size)
                parallel = run_parallel(a, spark, broker, stream)
            elif not a.typed_only:
                results = run_benchmarks(a, spark, broker, client, work)
                parallel = run_parallel(a, spark, broker, results.pop("source_stream"))
            if not a.skip_typed and not a.parallel_only:
                typed = run_typed(a, spark, broker, client)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    sections: list[str] = []
    goals: list[Goal] = []
    if results:
        text, goals = build_report(a, results)
        sections.append(text)
    if parallel is not None:
        parallel_text, parallel_goals = parallel_report(a, parallel)
        sections.append(parallel_text)
        goals += parallel_goals
    if typed is not None:
        typed_text, typed_goals = typed_report(a, typed)
        sections.append(typed_text)
        goals += typed_goals
    meta = machine_info()
    shape = "" if a.typed_only else (f", {a.rows:,} rows x {a.size} B, median of {a.repeats} "
                                     "run(s)")
    print(f"npstream Spark connector benchmark, {meta['date_utc']}, {meta['cores']} cores, "
          f"local[2]{shape}")
    print("\n\n".join(sections))
    print()
    print(render_goals(goals))
    if a.json:
        write_json(a.json, {"meta": meta, "args": vars(a), "results": results,
                            "typed": typed, "parallel": parallel}, goals)
    return 0


if __name__ == "__main__":
    sys.exit(main())

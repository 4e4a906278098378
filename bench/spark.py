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
"""

from __future__ import annotations

import argparse
import json
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
from bench_common import BrokerUnderTest, create_bench_stream, machine_info
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
    p.add_argument("--json", metavar="PATH", help="also write the raw results here")
    a = p.parse_args(argv)
    a.rows = a.rows or (QUICK_ROWS if a.quick else ROWS)
    a.repeats = a.repeats or (1 if a.quick else REPEATS)
    if a.rows < 1 or a.size < 1 or a.repeats < 1:
        p.error("--rows, --size and --repeats must be >= 1")
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


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from npstream import Client

    work = tempfile.mkdtemp(prefix="npstream-bench-spark-")
    spark = make_spark()
    try:
        with BrokerUnderTest() as broker, Client(broker.address) as client:
            results = run_benchmarks(a, spark, broker, client, work)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    text, goals = build_report(a, results)
    meta = machine_info()
    print(f"npstream Spark connector benchmark, {meta['date_utc']}, {meta['cores']} cores, "
          f"local[2], {a.rows:,} rows x {a.size} B, median of {a.repeats} run(s)")
    print(text)
    print()
    print(render_goals(goals))
    if a.json:
        write_json(a.json, {"meta": meta, "args": vars(a), "results": results}, goals)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The sensor tutorial's streaming processor, on Spark, reading from npstream.

Reads sensor readings from a typed npstream stream (the schema's fields are
columns: no from_json; producer.READING_SCHEMA), drops invalid ones,
computes per-sensor 5 s tumbling windows (count, sum, avg, min, max and the
number of readings over 80) with a 10 s event-time watermark (late readings
inside the watermark still count; later ones are dropped), optionally a
sliding-window variant, and fans each finished window out to the console,
JSON-lines files, a typed npstream results stream (created from the windows'
schema; no to_json) and an HTTP webhook from foreachBatch. A
StreamingQueryListener logs rows/s, batch duration and the watermark for
every batch; with --metrics-port another one counts the tutorial's live
metrics (events received, processed, dropped, windows emitted, backpressure
events, uptime, rate) and serves them over HTTP (live_metrics.py).

    spark-submit examples/sensor_pipeline/pipeline.py --broker localhost:7070 \
        --run-seconds 60 --output-dir /tmp/sensor-out

Exactly-once: the source's offsets live in the checkpoint; results written to
the npstream results stream carry the id "<sensorId>@<windowStart ms>", so a
micro-batch replayed after a crash is deduplicated by the stream.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable

import live_metrics
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger("sensor-pipeline")

ALERT_THRESHOLD = 80.0
RESULT_COLUMNS = ["windowStart", "windowEnd", "sensorId", "count", "sum", "avg", "min", "max",
                  "alertCount"]


def valid_readings(readings: DataFrame) -> DataFrame:
    """Keep only valid readings: a value, in celsius.

    The typed stream already refused readings of the wrong shape at publish
    (no sensor id or event time, a value that is not a number), so only what
    the schema cannot say is checked here.
    """
    return (
        readings.where(F.col("value").isNotNull() & (F.col("unit") == "celsius"))
        .select("sensorId", F.col("ts").alias("eventTime"), "value")
    )


def windowed(readings: DataFrame, window: str, watermark: str, slide: str | None = None
             ) -> DataFrame:
    """Per-sensor aggregates per event-time window (tumbling, or sliding when slide is set)."""
    win = F.window("eventTime", window, slide) if slide else F.window("eventTime", window)
    return (
        readings.withWatermark("eventTime", watermark)
        .groupBy(win.alias("w"), "sensorId")
        .agg(
            F.count("*").alias("count"),
            F.sum("value").alias("sum"),
            F.avg("value").alias("avg"),
            F.min("value").alias("min"),
            F.max("value").alias("max"),
            F.sum(F.when(F.col("value") > ALERT_THRESHOLD, 1).otherwise(0)).alias("alertCount"),
        )
        .select(
            F.col("w.start").alias("windowStart"),
            F.col("w.end").alias("windowEnd"),
            "sensorId", "count", "sum", "avg", "min", "max",
            F.col("alertCount").cast("long").alias("alertCount"),
        )
    )


class FanOut:
    """foreachBatch target: every finished window goes to each configured sink.

    Runs on the driver. Sinks fail independently: a webhook that is down is
    logged, it does not fail the query.
    """

    def __init__(self, *, broker: str, results_stream: str | None, output_dir: str | None,
                 webhook_url: str | None, console: bool, label: str) -> None:
        self.broker = broker
        self.results_stream = results_stream
        self.output_dir = output_dir
        self.webhook_url = webhook_url
        self.console = console
        self.label = label

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        batch = batch.orderBy("windowStart", "sensorId").cache()
        try:
            rows = batch.count()
            if rows == 0:
                return
            if self.console:
                print(f"--- {self.label} windows, batch {batch_id} ({rows} rows) ---", flush=True)
                batch.show(n=rows, truncate=False)
            if self.output_dir:
                batch.write.mode("append").json(os.path.join(self.output_dir, self.label))
            if self.results_stream:
                self._to_npstream(batch)
            if self.webhook_url:
                self._to_webhook(batch, batch_id)
        finally:
            batch.unpersist()

    def _to_npstream(self, batch: DataFrame) -> None:
        """The windows as typed records (the stream is created from their schema)."""
        ids = F.concat_ws("@", "sensorId", F.unix_millis("windowStart").cast("string"))
        (
            batch.select(ids.alias("id"), F.col("sensorId").alias("key"), *RESULT_COLUMNS)
            .write.format("npstream")
            .option("broker", self.broker)
            .option("stream", self.results_stream)
            .option("createStream", "true")
            .mode("append")
            .save()
        )

    def _to_webhook(self, batch: DataFrame, batch_id: int) -> None:
        payload = {
            "label": self.label,
            "batchId": batch_id,
            "windows": [json.loads(r) for r in batch.toJSON().collect()],
        }
        request = urllib.request.Request(
            self.webhook_url, data=json.dumps(payload).encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                response.read()
        except OSError as exc:
            log.warning("webhook %s failed for batch %d: %s", self.webhook_url, batch_id, exc)


class ProgressLogger(StreamingQueryListener):
    """One log line per micro-batch: rows/s, batch duration, watermark."""

    def onQueryStarted(self, event) -> None:
        log.info("query %s started", event.name or event.id)

    def onQueryProgress(self, event) -> None:
        p = event.progress
        log.info(
            "query %s batch %d: %d rows, %.1f rows/s, %d ms, watermark %s",
            p.name, p.batchId, p.numInputRows, p.processedRowsPerSecond or 0.0,
            p.batchDuration, (p.eventTime or {}).get("watermark", "-"),
        )

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        log.info("query %s terminated%s", event.id,
                 f" with {event.exception}" if event.exception else "")


def build_queries(spark: SparkSession, args: argparse.Namespace) -> list:
    """Start the tumbling (and optionally sliding) window queries; returns them."""
    reader = (
        spark.readStream.format("npstream")
        .option("broker", args.broker)
        .option("stream", args.source_stream)
        .option("startingOffsets", args.starting_offsets)
    )
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
    # Named observations feed the live metrics (live_metrics.py); they change no result.
    raw = live_metrics.observe_input(reader.load())
    readings = live_metrics.observe_valid(valid_readings(raw))
    variants: list[tuple[str, str | None]] = [("tumbling", None)]
    if args.slide:
        variants.append(("sliding", args.slide))
    queries = []
    for label, slide in variants:
        window = args.sliding_window if slide else args.window
        fan_out = FanOut(
            broker=args.broker,
            results_stream=args.results_stream if label == "tumbling" else None,
            output_dir=args.output_dir, webhook_url=args.webhook_url,
            console=not args.quiet, label=label,
        )
        writer = (
            live_metrics.observe_windows(windowed(readings, window, args.watermark, slide))
            .writeStream.outputMode("append")
            .queryName(f"sensor-{label}")
            .option("checkpointLocation", os.path.join(args.checkpoint_dir, label))
            .foreachBatch(fan_out)
        )
        if args.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{args.trigger_seconds} seconds")
        queries.append(writer.start())
    return queries


def stop_between_batches(query, timeout: float = 30.0) -> None:
    """Stop ``query`` once its running micro-batch (if any) has finished.

    ``stop()`` interrupts a running batch: its foreachBatch writes fail with
    an interrupt (and a screenful of JVM traces) although nothing is lost,
    the checkpoint just replays the batch next time. Waiting for the trigger
    to end keeps the demo's last output clean.
    """
    deadline = time.monotonic() + timeout
    while (query.isActive and query.status.get("isTriggerActive")
           and time.monotonic() < deadline):
        time.sleep(0.1)
    if query.isActive:
        query.stop()


def run(spark: SparkSession, args: argparse.Namespace,
        should_stop: Callable[[], bool] = lambda: False,
        metrics: live_metrics.LiveMetrics | None = None) -> None:
    """Run until --run-seconds pass, should_stop() is true, or (availableNow) all is read.

    Live metrics (live_metrics.py) are counted into ``metrics`` when given, else
    into a new collector served at --metrics-port while the pipeline runs.
    """
    spark.streams.addListener(ProgressLogger())
    served = None
    if metrics is None and args.metrics_port is not None:
        metrics = served = live_metrics.LiveMetrics(trigger_seconds=args.trigger_seconds)
        url = served.serve(args.metrics_host, args.metrics_port)
        print(f"[metrics] live metrics at {url} (Prometheus text: {url}/prometheus)",
              flush=True)
    listener = metrics.listener() if metrics is not None else None
    if listener is not None:
        spark.streams.addListener(listener)
    queries: list = []
    try:
        _run_queries(spark, args, should_stop, queries)
    finally:
        if listener is not None and metrics is not None:
            spark.streams.removeListener(listener)
            metrics.catch_up(queries)
        if served is not None:
            print(served.report(), flush=True)
            served.stop()


def _run_queries(spark: SparkSession, args: argparse.Namespace,
                 should_stop: Callable[[], bool], queries: list) -> None:
    queries.extend(build_queries(spark, args))
    deadline = time.monotonic() + args.run_seconds if args.run_seconds else None
    try:
        while any(q.isActive for q in queries):
            if (deadline and time.monotonic() > deadline) or should_stop():
                break
            for q in queries:
                q.awaitTermination(0.5)
    finally:
        for q in queries:
            stop_between_batches(q)
        for q in queries:
            if q.exception():
                raise RuntimeError(f"query {q.name} failed: {q.exception()}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", default=os.environ.get("NPSTREAM_BROKER", "localhost:7070"))
    p.add_argument("--source-stream", default="sensor-readings")
    p.add_argument("--results-stream", default="sensor-windows",
                   help="npstream stream for tumbling-window results ('' to skip)")
    p.add_argument("--output-dir", default=None, help="JSON-lines output root (default: none)")
    p.add_argument("--webhook-url", default=None, help="POST each batch's windows here")
    p.add_argument("--checkpoint-dir", default=None,
                   help="checkpoint root (default: a fresh temporary directory)")
    p.add_argument("--starting-offsets", default="earliest")
    p.add_argument("--window", default="5 seconds")
    p.add_argument("--watermark", default="10 seconds")
    p.add_argument("--slide", default=None, help="also run sliding windows with this slide, "
                   "e.g. '5 seconds'")
    p.add_argument("--sliding-window", default="10 seconds")
    p.add_argument("--trigger-seconds", type=float, default=2.0)
    p.add_argument("--max-offsets-per-trigger", type=int, default=0)
    p.add_argument("--available-now", action="store_true",
                   help="process what is in the stream now, then stop")
    p.add_argument("--run-seconds", type=float, default=0.0, help="stop after this long")
    p.add_argument("--quiet", action="store_true", help="no console sink")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="serve the live metrics (tutorial JSON at /metrics, Prometheus text at "
                        "/metrics/prometheus) on this port; 0 picks one (default: off)")
    p.add_argument("--metrics-host", default="127.0.0.1")
    args = p.parse_args(argv)
    args.results_stream = args.results_stream or None
    if args.checkpoint_dir is None:
        args.checkpoint_dir = tempfile.mkdtemp(prefix="sensor-pipeline-ckpt-")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one line per py4j callback otherwise
    args = parse_args(argv)
    spark = (
        SparkSession.builder.appName("npstream-sensor-pipeline")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    try:
        run(spark, args)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

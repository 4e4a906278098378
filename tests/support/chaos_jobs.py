"""The Spark side of the chaos tests: the two queries, their input and their exact expected output.

Run as a script, this file is the driver a chaos test kills with SIGKILL:

    python chaos_jobs.py BROKER A B C CHECKPOINT_B CHECKPOINT_C PER_BATCH run|finish

It starts two streaming queries on its own ``local[2]`` SparkSession, both
reading stream A and both writing with the exactly-once sink:

* **copy**: A's ``id``, ``key`` and ``value`` into B;
* **windows**: tumbling 10-second event-time windows per key, counted with a
  20-second watermark, ``outputMode("append")`` into C (each window is written
  once, when the watermark passes its end; ``update`` and ``complete`` would
  write rows whose number depends on where micro-batches were cut, which no two
  runs need share).

``run`` triggers a micro-batch every half second with ``maxOffsetsPerTrigger``
so kills land mid-way; ``finish`` drains what is left (Trigger.AvailableNow)
and exits 0. The same ``start_queries`` serves the in-process clean reference
run, so chaos and clean runs are the same queries by construction.

The input is made so the exact result is known without Spark: event time and
key are in the value (``"<key>,<event second>"``), a little out of order but
never later than the watermark allows, and a last sentinel event an hour later
closes every real window (its own window never closes). ``expected_windows``
is what C must hold, as a multiset of (window start, key, count).
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

__all__ = [
    "KEYS",
    "SENTINEL_SECOND",
    "WATERMARK",
    "WINDOW_SECONDS",
    "expected_windows",
    "source_rows",
    "start_queries",
    "window_rows",
]

KEYS = ("k0", "k1", "k2")
WINDOW_SECONDS = 10
WATERMARK = "20 seconds"
SENTINEL_SECOND = 3600 * 24  # a day in: past every real window's end + the watermark
START_SECOND = 1_800_000_000  # event times are seconds since the epoch from here


def _event(i: int) -> tuple[str, int]:
    """(key, event second) of source message i: 4 events a second, up to 8 s out of order."""
    return KEYS[i % len(KEYS)], START_SECOND + i // 4 + (i * 37) % 9


def source_rows(count: int) -> list[dict[str, Any]]:
    """The ``count`` messages of stream A, then the sentinel (ids ``a-<i>``, ``a-end``)."""
    rows: list[dict[str, Any]] = []
    for i in range(count):
        key, second = _event(i)
        rows.append({"id": f"a-{i}", "key": key.encode(), "value": f"{key},{second}".encode()})
    rows.append({"id": "a-end", "key": b"k0",
                 "value": f"k0,{START_SECOND + SENTINEL_SECOND}".encode()})
    return rows


def expected_windows(count: int) -> Counter[tuple[int, str, int]]:
    """C's rows for ``count`` source messages: (window start second, key, count), once each."""
    per_window: Counter[tuple[int, str]] = Counter()
    for i in range(count):
        key, second = _event(i)
        per_window[(second - second % WINDOW_SECONDS, key)] += 1
    return Counter((start, key, n) for (start, key), n in per_window.items())


def window_rows(values: list[bytes]) -> Counter[tuple[int, str, int]]:
    """C's stored values (``"<window start>,<key>,<count>"``) as a multiset."""
    found: Counter[tuple[int, str, int]] = Counter()
    for value in values:
        start, key, n = value.decode().split(",")
        found[(int(start), key, int(n))] += 1
    return found


def start_queries(spark: Any, broker: str, source: str, copy_target: str, window_target: str,
                  checkpoints: tuple[str, str], per_batch: int, mode: str) -> list[Any]:
    """Start the copy and the windowed count; ``mode`` 'run' (0.5 s trigger) or 'finish'."""
    from pyspark.sql import functions as f

    def read() -> Any:
        return (spark.readStream.format("npstream").option("broker", broker)
                .option("stream", source).option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", str(per_batch)).load())

    def write(frame: Any, target: str, checkpoint: str, name: str) -> Any:
        writer = (frame.writeStream.format("npstream").option("broker", broker)
                  .option("stream", target).option("checkpointLocation", checkpoint)
                  .queryName(name))
        if mode == "finish":
            return writer.trigger(availableNow=True)
        return writer.trigger(processingTime="0.5 seconds")

    copy = write(read().select("id", "key", "value"), copy_target, checkpoints[0], "chaos-copy")
    parts = f.split(f.col("value").cast("string"), ",")
    events = read().select(parts.getItem(0).alias("k"),
                           f.timestamp_seconds(parts.getItem(1).cast("long")).alias("t"))
    counted = (events.withWatermark("t", WATERMARK)
               .groupBy(f.window("t", f"{WINDOW_SECONDS} seconds"), "k").count()
               .select(f.concat_ws(",", f.unix_timestamp("window.start").cast("string"), "k",
                                   f.col("count").cast("string")).alias("value")))
    windows = write(counted, window_target, checkpoints[1], "chaos-windows")
    return [copy.outputMode("append").start(), windows.outputMode("append").start()]


def main(argv: list[str]) -> int:
    broker, source, copy_target, window_target, checkpoint_b, checkpoint_c = argv[:6]
    per_batch, mode = int(argv[6]), argv[7]
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("npstream-chaos")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    queries = start_queries(spark, broker, source, copy_target, window_target,
                            (checkpoint_b, checkpoint_c), per_batch, mode)
    print("STARTED", flush=True)
    for query in queries:
        query.awaitTermination()
    print("FINISHED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What the Spark Connect tests do on the client side, run in a process of its own.

PySpark allows no Connect session in a process that already has a classic
SparkSession (SESSION_ALREADY_EXIST), and a Connect session switches the
whole process to Connect (SPARK_CONNECT_MODE_ENABLED); the test session
keeps a classic local one. So test_connect.py calls these functions in a
child process (``ConnectClient``), which holds one Connect session, and
checks what they return: plain values, nothing of Spark's.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

__all__ = ["ConnectClient"]

_session: Any = None


def _spark(url: str) -> Any:
    global _session
    if _session is None:
        from pyspark.sql import SparkSession

        _session = SparkSession.builder.remote(url).getOrCreate()
    return _session


def _stop() -> None:
    global _session
    if _session is not None:
        _session.stop()
        _session = None


def batch_read(url: str, broker: str, stream: str, where: str) -> dict[str, Any]:
    """Columns of a batch read, and offset, id, value (text) of the rows matching ``where``."""
    frame = (_spark(url).read.format("npstream").option("broker", broker)
             .option("stream", stream).load())
    rows = (frame.where(where).selectExpr("offset", "id", "CAST(value AS STRING) AS value")
            .orderBy("offset").collect())
    return {"columns": frame.columns, "rows": [tuple(r) for r in rows]}


def streaming_read(url: str, broker: str, stream: str, table: str,
                   max_per_trigger: int) -> dict[str, Any]:
    """A streaming read into a memory table (AvailableNow): rows per batch, the table's rows."""
    spark = _spark(url)
    query = (spark.readStream.format("npstream").option("broker", broker)
             .option("stream", stream).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(max_per_trigger)).load()
             .writeStream.format("memory").queryName(table)
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    frame = spark.table(table)
    strings = [f"CAST({c} AS STRING) AS {c}" if c in ("timestamp", "ts") else c
               for c in frame.columns if c not in ("key",)]
    return {
        "exception": str(query.exception()) if query.exception() else None,
        "input_rows": [p.numInputRows for p in query.recentProgress if p.numInputRows],
        "columns": frame.columns,
        "rows": [r.asDict() for r in frame.selectExpr(*strings).orderBy("offset").collect()],
    }


def copy(url: str, broker: str, source: str, target: str, checkpoint: str,
         max_per_trigger: int) -> dict[str, Any]:
    """A streaming npstream -> npstream copy (AvailableNow); the ids of batches with rows."""
    query = (_spark(url).readStream.format("npstream").option("broker", broker)
             .option("stream", source).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(max_per_trigger)).load()
             .writeStream.format("npstream").option("broker", broker)
             .option("stream", target).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    return {"exception": str(query.exception()) if query.exception() else None,
            "batches": [p.batchId for p in query.recentProgress if p.numInputRows]}


class ConnectClient:
    """One child process with one Connect session to ``url``; ``run(f, ...)`` calls f there."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._pool = ProcessPoolExecutor(max_workers=1,
                                         mp_context=multiprocessing.get_context("spawn"))

    def run(self, function: Callable[..., Any], *args: Any, timeout: float = 240) -> Any:
        return self._pool.submit(function, self.url, *args).result(timeout)

    def close(self) -> None:
        try:
            self._pool.submit(_stop).result(60)
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)

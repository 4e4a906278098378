"""Reading one offset range into Spark: the read schema and the task-side read loop.

Shared by the streaming and the batch reader. A task reads exactly
``[start, end)`` of one stream - from the broker's segment files when the task
runs on the broker's machine, else over gRPC (``Client.read_batches``) - and
yields Arrow record batches in the declared Spark schema: the stored batches
are decoded without per-row work and re-shaped column by column (timestamp
ms -> us, a constant ``stream`` column, a typed stream's value struct
projected to its declared columns: ``read_schema.to_spark_batch``). Reading
the same range twice returns the same rows, because offsets are dense and
never reused; messages removed by retention or a deleted stream go through
``report_data_loss``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from npstream.spark.data_loss import report_data_loss
from npstream.spark.options import ReadOptions
from npstream.spark.read_schema import ReadSchema, to_spark_batch

if TYPE_CHECKING:
    from npstream.client.client import Client

__all__ = [
    "RangePartition",
    "arrow_read_schema",
    "read_partition",
    "spark_read_schema",
    "to_spark_batch",
]

log = logging.getLogger("npstream.spark.reader")

# Messages asked for per Fetch; fetchMaxBytes is the real bound, this only
# keeps one response from holding millions of tiny rows.
FETCH_MAX_MESSAGES = 100_000


def spark_read_schema(include_headers: bool) -> StructType:
    """The untyped DataFrame schema: stream, offset, id, key, value, timestamp[, headers]."""
    return ReadSchema(include_headers).spark_schema()


def arrow_read_schema(include_headers: bool) -> pa.Schema:
    """The Arrow form of ``spark_read_schema``; Spark rejects batches that differ from it."""
    return ReadSchema(include_headers).arrow_schema


class RangePartition(InputPartition):
    """One Spark task: messages ``[start, end)`` of ``stream`` (pickled to the executor).

    ``read_from``: where the whole batch reads the stream from (the task may
    hold a later piece of it), so a task that finds messages removed names
    every removed offset the query had not read, not only its own piece's.
    """

    def __init__(self, stream: str, start: int, end: int, read_from: int | None = None) -> None:
        super().__init__((stream, start, end))
        self.stream = stream
        self.start = start
        self.end = end
        self.read_from = start if read_from is None else read_from

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangePartition) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def read_partition(options: ReadOptions, part: RangePartition,
                   client: Client | None = None,
                   schema: ReadSchema | None = None) -> Iterator[pa.RecordBatch]:
    """Yield every message of ``part`` as Spark-ready batches (task side).

    ``schema`` is the read schema decided when the source was loaded (default:
    untyped). Opens its own client unless one is given. A gap left by retention, a
    deleted stream or a stream that now ends before ``part.end`` (deleted and
    re-created) is reported through ``report_data_loss``: it raises with
    failOnDataLoss=true, otherwise the gap is skipped.
    """
    own = client is None
    active = options.connection.connect() if client is None else client
    layout = ReadSchema(options.include_headers) if schema is None else schema
    try:
        yield from _fetch_loop(active, options, part, layout)
    finally:
        if own:
            active.close()


def _fetch_loop(client: Client, options: ReadOptions, part: RangePartition,
                schema: ReadSchema) -> Iterator[pa.RecordBatch]:
    from npstream.errors import OffsetOutOfRange, StreamNotFound

    stream, position, end = part.stream, part.start, part.end
    fail = options.fail_on_data_loss
    rows = 0
    while position < end:
        try:
            batches, next_offset = client.read_batches(
                stream, position, end_offset=end,
                max_messages=min(end - position, FETCH_MAX_MESSAGES),
                max_bytes=options.fetch_max_bytes,
            )
        except StreamNotFound:
            report_data_loss(stream, position, end, "the stream was deleted", fail=fail)
            return
        except OffsetOutOfRange as exc:
            first, last = _bounds(client, stream, exc)
            if first is None or position >= first:
                if last is not None and last < end:
                    report_data_loss(stream, max(position, last), end,
                                     f"the stream now ends at offset {last}", fail=fail)
                    return
                raise
            removed = min(part.read_from, position)
            report_data_loss(stream, position, min(first, end),
                             f"retention moved the stream's start_offset to {first}: offsets "
                             f"[{removed}, {first}) were removed before the query read them",
                             fail=fail)
            position = first
            continue
        if next_offset <= position:
            # Nothing at an offset below the planned end: the stream is shorter
            # than when the batch was planned (deleted and re-created).
            _, last = _bounds(client, stream, None)
            reason = ("the stream was deleted" if last is None
                      else f"the stream now ends at offset {last}")
            report_data_loss(stream, position, end, reason, fail=fail)
            return
        for batch in batches:
            rows += batch.num_rows
            yield to_spark_batch(batch, stream, schema)
        position = next_offset
    log.debug("read stream '%s' offsets [%d, %d): %d messages", stream, part.start, end, rows)


def _bounds(client: Client, stream: str,
            exc: Exception | None) -> tuple[int | None, int | None]:
    """The stream's current (start_offset, end_offset), from the error or one RPC."""
    start = getattr(exc, "start_offset", -1)
    end = getattr(exc, "end_offset", -1)
    if start is not None and start >= 0 and end is not None and end >= 0:
        return start, end
    from npstream.errors import StreamNotFound

    try:
        found = client.end_offsets([stream]).get(stream)
    except StreamNotFound:
        return None, None
    return found if found is not None else (None, None)

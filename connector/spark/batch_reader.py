"""The batch reader (``spark.read.format("npstream")``) and its filter pushdown.

A batch read resolves, per stream, ``[start, end)`` from startingOffsets /
startingTimestamp and endingOffsets / endingTimestamp, narrows it with the
pushed filters, splits it like a micro-batch (``partitioning.py``) and reads
each piece with the same task code as the streaming reader.

Pushdown: ``offset`` comparisons (=, >, >=, <, <=) and ``stream`` = / IN are
applied exactly and not re-checked by Spark; ``offset IN (...)`` narrows the
fetch to [min, max] and timestamp comparisons narrow it through
offset_for_timestamp (timestamps never decrease within a stream), and Spark
re-checks both. A narrowed range never touches the offsets outside it, so
messages removed by retention but filtered away are not data loss.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from npstream.proto.units import EPOCH
from npstream.spark.options import InvalidOptionError, ReadOptions
from npstream.spark.partitioning import OffsetRange, split_ranges
from npstream.spark.range_reader import RangePartition, read_partition
from npstream.spark.read_schema import ReadSchema
from npstream.spark.stream_reader import check_start, resolve_start, subscribed_bounds

if TYPE_CHECKING:
    import pyarrow as pa

    from npstream.client.client import Client

__all__ = [
    "Narrowing",
    "NpstreamBatchReader",
    "NpstreamPushdownBatchReader",
    "pushdown_requested",
    "resolve_end",
]

log = logging.getLogger("npstream.spark.batch")

_PUSHDOWN_WORKER = "pyspark.sql.worker.data_source_pushdown_filters"


def pushdown_requested() -> bool:
    """True inside Spark's filter-pushdown planning worker.

    Spark refuses a reader that overrides ``pushFilters`` unless
    ``spark.sql.python.filterPushdown.enabled`` is true (default false), and
    the data source cannot read that setting. Spark runs pushdown in its own
    worker module, so the source hands out the pushdown reader only there and
    the plain reader everywhere else: reads work with the setting off and are
    narrowed with it on.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return _PUSHDOWN_WORKER in sys.modules or getattr(spec, "name", None) == _PUSHDOWN_WORKER


def _epoch_us(value: Any) -> int | None:
    if not isinstance(value, dt.datetime):
        return None
    moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return (moment - EPOCH) // dt.timedelta(microseconds=1)


def _ceil_ms(micros: int) -> int:
    return -((-micros) // 1000)


def _is_offset(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Narrowing:
    """What the pushed filters allow: streams, an offset window, a time window (ms).

    Offsets ``[offset_from, offset_until)``; times ``[time_from_ms, time_until_ms)``.
    """

    streams: frozenset[str] | None = None
    offset_from: int = 0
    offset_until: int | None = None
    time_from_ms: int | None = None
    time_until_ms: int | None = None

    def allows(self, stream: str) -> bool:
        return self.streams is None or stream in self.streams

    def with_streams(self, names: Iterable[str]) -> Narrowing:
        wanted = frozenset(names)
        return replace(self, streams=wanted if self.streams is None else self.streams & wanted)

    def with_offsets(self, low: int | None = None, high: int | None = None) -> Narrowing:
        result = self
        if low is not None:
            result = replace(result, offset_from=max(result.offset_from, low))
        if high is not None:
            until = high if result.offset_until is None else min(result.offset_until, high)
            result = replace(result, offset_until=until)
        return result

    def with_times(self, low: int | None = None, high: int | None = None) -> Narrowing:
        result = self
        if low is not None:
            current = result.time_from_ms
            result = replace(result, time_from_ms=low if current is None else max(current, low))
        if high is not None:
            current = result.time_until_ms
            result = replace(result,
                             time_until_ms=high if current is None else min(current, high))
        return result

    def apply(self, filter_: Filter) -> tuple[Narrowing, bool] | None:
        """(narrowed, exact) for a filter this reader understands, else None."""
        column = getattr(filter_, "attribute", None)
        value = getattr(filter_, "value", None)
        if column == ("stream",):
            if isinstance(filter_, EqualTo) and isinstance(value, str):
                return self.with_streams([value]), True
            if isinstance(filter_, In) and all(isinstance(v, str) for v in filter_.value):
                return self.with_streams(filter_.value), True
            return None
        if column == ("offset",):
            return self._apply_offset(filter_, value)
        if column == ("timestamp",):
            return self._apply_time(filter_, value)
        return None

    def _apply_offset(self, filter_: Filter, value: Any) -> tuple[Narrowing, bool] | None:
        if isinstance(filter_, In):
            values = [v for v in value if v is not None]
            if not values or not all(_is_offset(v) for v in values):
                return None
            return self.with_offsets(max(min(values), 0), max(max(values) + 1, 0)), False
        if not _is_offset(value):
            return None
        bounds: dict[type, tuple[int | None, int | None]] = {
            EqualTo: (value, value + 1),
            GreaterThan: (value + 1, None),
            GreaterThanOrEqual: (value, None),
            LessThan: (None, value),
            LessThanOrEqual: (None, value + 1),
        }
        if type(filter_) not in bounds:
            return None
        low, high = bounds[type(filter_)]
        return self.with_offsets(None if low is None else max(low, 0),
                                 None if high is None else max(high, 0)), True

    def _apply_time(self, filter_: Filter, value: Any) -> tuple[Narrowing, bool] | None:
        micros = _epoch_us(value)
        if micros is None:
            return None
        # Message times are whole milliseconds: t_ms*1000 >= x  <=>  t_ms >= ceil(x/1000).
        at_least, above = _ceil_ms(micros), micros // 1000 + 1
        bounds: dict[type, tuple[int | None, int | None]] = {
            EqualTo: (at_least, above),
            GreaterThan: (above, None),
            GreaterThanOrEqual: (at_least, None),
            LessThan: (None, at_least),
            LessThanOrEqual: (None, above),
        }
        if type(filter_) not in bounds:
            return None
        low, high = bounds[type(filter_)]
        return self.with_times(low, high), False

    def narrow(self, client: Client, stream: str, start: int, end: int) -> tuple[int, int]:
        """The part of ``[start, end)`` of one stream that the filters can match."""
        start = max(start, self.offset_from)
        if self.offset_until is not None:
            end = min(end, self.offset_until)
        if start < end and self.time_from_ms is not None:
            start = max(start, client.offset_for_timestamp(stream, self.time_from_ms))
        if start < end and self.time_until_ms is not None:
            end = min(end, client.offset_for_timestamp(stream, self.time_until_ms))
        return start, max(start, end)


def resolve_end(client: Client, options: ReadOptions, stream: str, first: int,
                last: int) -> int:
    """Exclusive end of a batch read of one stream, from endingOffsets / endingTimestamp."""
    ending = options.ending
    if ending.kind == "timestamp":
        assert ending.timestamp_ms is not None
        return client.offset_for_timestamp(stream, ending.timestamp_ms)
    kind, explicit = ending.for_stream(stream, default_kind="latest")
    if kind != "offsets":
        return last
    assert explicit is not None
    if explicit > last:
        raise InvalidOptionError(
            f"Invalid value for option 'endingOffsets': offset {explicit} for stream "
            f"'{stream}' is beyond its end_offset {last}. Accepted: an offset in "
            f"[{first}, {last}] or -1 (latest)."
        )
    return explicit


class NpstreamBatchReader(DataSourceReader):
    """Batch read of the subscribed streams (see NpstreamDataSource for options)."""

    def __init__(self, options: ReadOptions, *, schema: ReadSchema | None = None) -> None:
        self._options = options
        # The read schema decided at load() (default: untyped), shipped to tasks.
        self._schema = ReadSchema(options.include_headers) if schema is None else schema
        self._narrowing = Narrowing()

    def plan_ranges(self, client: Client) -> list[OffsetRange]:
        """One ``[start, end)`` per subscribed stream, after the pushed filters."""
        bounds = subscribed_bounds(client, self._options)
        missing = [name for name in self._options.streams if name not in bounds]
        if missing:
            from npstream.errors import StreamNotFound

            raise StreamNotFound(
                f"stream(s) {', '.join(repr(m) for m in missing)} named by option 'stream' do "
                f"not exist on broker {client.address}"
            )
        ranges = []
        for name, (first, last) in sorted(bounds.items()):
            if not self._narrowing.allows(name):
                continue
            start, source = resolve_start(client, self._options, name, first, last)
            end = resolve_end(client, self._options, name, first, last)
            # Narrow first: offsets the filters exclude are never read, so their
            # removal by retention is not data loss.
            start, end = self._narrowing.narrow(client, name, start, max(start, end))
            if start < end:
                start = check_start(self._options, name, start, first, source)
            ranges.append(OffsetRange(name, start, max(start, end)))
        return ranges

    def partitions(self) -> Sequence[InputPartition]:
        with self._options.connection.connect() as client:
            ranges = self.plan_ranges(client)
        pieces = split_ranges(
            ranges,
            max_records_per_partition=self._options.max_records_per_partition,
            min_partitions=self._options.min_partitions,
            parallelism=self._options.parallelism,
        )
        log.info("batch read of %s: %s in %d partitions",
                 self._options.describe_subscription(),
                 ", ".join(f"{r.stream}[{r.start},{r.end})" for r in ranges) or "nothing",
                 len(pieces))
        if not pieces:
            # Spark replaces an empty list with one partition of its own; give it
            # an empty range instead, which reads nothing.
            return [RangePartition(ranges[0].stream if ranges else "", 0, 0)]
        read_from = {r.stream: r.start for r in ranges}
        return [RangePartition(p.stream, p.start, p.end, read_from[p.stream]) for p in pieces]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_partition(self._options, partition, schema=self._schema)


class NpstreamPushdownBatchReader(NpstreamBatchReader):
    """The batch reader with ``pushFilters`` (only handed out when Spark pushes filters)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        recheck: list[Filter] = []
        for filter_ in filters:
            result = self._narrowing.apply(filter_)
            if result is None:
                recheck.append(filter_)
                continue
            self._narrowing, exact = result
            if not exact:
                recheck.append(filter_)
        log.debug("pushed filters %s -> %s", filters, self._narrowing)
        return recheck

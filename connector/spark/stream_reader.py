"""The streaming reader: offsets per stream, admission control, AvailableNow, group commits.

Driver side (one long-lived Python process per query): ``initialOffset``,
``latestOffset``, ``partitions``, ``commit``. Executor side: ``read``, which
only uses the partition it is given (the reader object is pickled to tasks
before any driver state exists).

Offsets are ``{stream: next_offset}`` (see ``offsets.py``). Streams that join
a ``streamPattern`` after the query started are read from their earliest
offset; a stream whose offset went backwards (deleted and re-created) is read
again from its earliest offset after data loss is reported; a deleted stream
is reported and dropped. Spark's checkpoint is the source of truth for progress;
``commit`` only mirrors it into the broker-side group for lag and for
``startingOffsets=group``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from npstream.spark.data_loss import report_data_loss
from npstream.spark.offsets import SourceOffset
from npstream.spark.options import InvalidOptionError, ReadOptions
from npstream.spark.partitioning import OffsetRange, prorate, split_ranges
from npstream.spark.range_reader import RangePartition, read_partition
from npstream.spark.read_schema import ReadSchema, missing_streams_error

if TYPE_CHECKING:
    import pyarrow as pa

    from npstream.client.client import Client

__all__ = [
    "NpstreamStreamReader",
    "check_start",
    "commit_group_position",
    "group_position",
    "resolve_start",
    "subscribed_bounds",
]

log = logging.getLogger("npstream.spark.stream")

Bounds = dict[str, tuple[int, int]]  # stream -> (start_offset, end_offset)


def subscribed_bounds(client: Client, options: ReadOptions) -> Bounds:
    """(start_offset, end_offset) of every subscribed stream that exists, in one RPC."""
    from npstream.errors import StreamNotFound

    if options.stream_pattern is not None:
        return client.end_offsets(pattern=options.stream_pattern)
    try:
        return client.end_offsets(options.streams)
    except StreamNotFound:
        # A named stream is gone; ask for all streams so the others still resolve.
        everything = client.end_offsets(pattern="*")
        return {name: everything[name] for name in options.streams if name in everything}


def group_position(client: Client, stream: str, group: str) -> int | None:
    """The group's position on the stream; None when the group does not exist.

    When retention removed messages the group had not read, its stored
    position (below the stream's start_offset), so that ``check_start``
    reports the whole removed range.
    """
    from npstream.errors import GroupNotFound, StreamNotFound

    try:
        info = client.describe_group(stream, group)
    except (GroupNotFound, StreamNotFound):
        return None
    if info.removed_unread is not None:
        return int(info.removed_unread[0])
    return int(info.committed_offset)


def resolve_start(client: Client, options: ReadOptions, stream: str, first: int,
                  last: int) -> tuple[int, str]:
    """Where reading of one stream should start, and what asked for it.

    From startingOffsets / startingTimestamp; ``first``/``last`` are the
    stream's start_offset and end_offset. Streams not named in a
    startingOffsets JSON start at the earliest offset. The offset may lie below
    ``first`` (retention removed it): ``check_start`` decides what then.
    """
    kind, explicit = options.starting.for_stream(stream, default_kind="earliest")
    if kind == "earliest":
        return first, "earliest"
    if kind == "latest":
        return last, "latest"
    if kind == "timestamp":
        assert options.starting.timestamp_ms is not None
        return client.offset_for_timestamp(stream, options.starting.timestamp_ms), (
            "startingTimestamp")
    if kind == "group":
        assert options.group is not None
        position = group_position(client, stream, options.group)
        if position is None:
            log.info("group '%s' has no position on stream '%s'; starting at earliest offset %d",
                     options.group, stream, first)
            return first, "earliest"
        return min(position, last), f"group '{options.group}'"
    assert explicit is not None
    if explicit > last:
        raise InvalidOptionError(
            f"Invalid value for option 'startingOffsets': offset {explicit} for stream "
            f"'{stream}' is beyond its end_offset {last}. Accepted: an offset in "
            f"[{first}, {last}], -2 (earliest) or -1 (latest)."
        )
    return explicit, "startingOffsets"


def check_start(options: ReadOptions, stream: str, offset: int, first: int, source: str) -> int:
    """``offset``, or ``first`` after reporting data loss when retention removed it."""
    if offset < first:
        report_data_loss(stream, offset, first,
                         f"{source} asks for offset {offset} but retention moved the "
                         f"stream's start_offset to {first}", fail=options.fail_on_data_loss)
        return first
    return offset


class NpstreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader over one or more streams (see NpstreamDataSource for options)."""

    def __init__(self, options: ReadOptions,
                 clock: Callable[[], float] = time.monotonic, *,
                 schema: ReadSchema | None = None) -> None:
        self._options = options
        # The read schema decided at load() (default: untyped), shipped to tasks.
        self._schema = ReadSchema(options.include_headers) if schema is None else schema
        self._clock = clock  # seconds; injectable so maxTriggerDelay tests are exact
        self._client: Client | None = None
        self._last_trigger: float | None = None  # monotonic seconds of the last admitted batch
        self._target: dict[str, int] | None = None  # AvailableNow: ends recorded at start
        self._latest: dict[str, int] | None = None
        self._group_positions: dict[str, int] = {}  # last position written to the group
        # Earliest offsets of streams that joined (or were re-created), seen by
        # latestOffset, so that partitions() plans them from the same offset.
        self._fresh_starts: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # connections never travel to executors
        return state

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = self._options.connection.connect()
        return self._client

    # ------------------------------------------------------------ driver: offsets

    def initialOffset(self) -> dict[str, int]:
        bounds = subscribed_bounds(self.client, self._options)
        missing = [name for name in self._options.streams if name not in bounds]
        if missing:  # deleted since load()
            raise missing_streams_error(missing, self.client.address)
        offsets = {}
        for name, (first, last) in sorted(bounds.items()):
            offset, source = resolve_start(self.client, self._options, name, first, last)
            offsets[name] = check_start(self._options, name, offset, first, source)
        log.info("initial offsets (%s, %s): %s", self._options.describe_subscription(),
                 self._options.starting.kind, SourceOffset(offsets).to_json())
        return offsets

    def getDefaultReadLimit(self) -> ReadLimit:
        """ReadMaxRows when maxOffsetsPerTrigger is set, else ReadMinRows, else all.

        Python sources cannot return Spark's composite limit; when both options
        are set the engine passes ReadMaxRows and latestOffset applies
        minOffsetsPerTrigger from the options as well.
        """
        if self._options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self._options.max_offsets_per_trigger)
        if self._options.min_offsets_per_trigger is not None:
            return ReadMinRows(self._options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        bounds = subscribed_bounds(self.client, self._options)
        self._target = {name: last for name, (_, last) in bounds.items()}
        log.info("Trigger.AvailableNow: reading up to %s", SourceOffset(self._target).to_json())

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        begin = SourceOffset.from_dict(start)
        # `start` is where the last completed batch ended: record it now, since
        # Spark calls commit() for a batch only when it plans the next one, so
        # the last batch of an AvailableNow run would otherwise never be recorded.
        self._record_group_position(begin)
        bounds = subscribed_bounds(self.client, self._options)
        latest = {name: last for name, (_, last) in bounds.items()}
        # What query progress shows as latestOffset (reportLatestOffset): the broker's end
        # offsets, also when maxOffsetsPerTrigger or AvailableNow's target stop the batch
        # earlier, so lastProgress says how far behind the query is.
        self._latest = dict(latest)
        if self._target is not None:
            latest = {name: min(end, latest[name]) for name, end in self._target.items()
                      if name in latest}
        reported = self._report_gone_and_recreated(begin, bounds)
        self._fresh_starts = {name: min(bounds[name][0], end) for name, end in latest.items()
                              if _is_fresh(begin.get(name), end)}
        for name in sorted(set(latest) - begin.streams):
            log.info("stream '%s' joined %s; reading it from its earliest offset %d "
                     "(end_offset %d)", name, self._options.describe_subscription(),
                     self._fresh_starts[name], latest[name])

        # Where each stream's next batch really starts: the earliest offset for
        # new or re-created streams, start_offset when retention removed a gap
        # (the task reports that gap).
        effective = {
            name: self._fresh_starts[name] if name in self._fresh_starts
            else max(begin.get(name) or 0, bounds[name][0])
            for name in latest
        }

        if isinstance(limit, ReadAllAvailable):
            return latest
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else (
            self._options.max_offsets_per_trigger)
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else (
            self._options.min_offsets_per_trigger)
        # A reported loss is not held back by minOffsetsPerTrigger: the next
        # batch moves past it, so the warning is not repeated every trigger.
        if min_rows is not None and self._target is None and not reported:
            backlog = sum(end - effective[name] for name, end in latest.items())
            if not self._admit(backlog, min_rows):
                return start
        if max_rows is not None:
            return prorate(max_rows, effective, latest)
        return latest

    def _admit(self, backlog: int, min_rows: int) -> bool:
        """minOffsetsPerTrigger with maxTriggerDelay, as Kafka: wait unless enough or too long."""
        now = self._clock()
        delay_s = self._options.max_trigger_delay_ms / 1000
        overdue = self._last_trigger is None or now - self._last_trigger >= delay_s
        if overdue or backlog >= min_rows:
            self._last_trigger = now
            return True
        log.debug("delaying batch: %d new messages < minOffsetsPerTrigger %d", backlog, min_rows)
        return False

    def _report_gone_and_recreated(self, begin: SourceOffset, bounds: Bounds) -> bool:
        """Data-loss checks the driver can make; True when something was reported."""
        fail = self._options.fail_on_data_loss
        deleted = sorted(begin.streams - set(bounds))
        for name in deleted:
            report_data_loss(name, begin.get(name) or 0, None,
                             "the stream was deleted; it is dropped from the query", fail=fail)
        recreated: list[str] = []
        for name, (_, last) in sorted(bounds.items()):
            position = begin.get(name)
            if position is not None and position > last:
                recreated.append(name)
                report_data_loss(
                    name, position, None,
                    f"the stream's end_offset is now {last}, below the query's position "
                    f"{position}: it was deleted and re-created; reading it again from its "
                    "earliest offset",
                    fail=fail,
                )
        return bool(deleted or recreated)

    def reportLatestOffset(self) -> dict[str, int] | None:
        """The broker's end offsets at the last ``latestOffset`` call (query progress shows
        them as ``latestOffset`` beside the batch's ``endOffset``); None before the first."""
        return self._latest

    # ------------------------------------------------------------ driver: planning

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        begin = SourceOffset.from_dict(start)
        stops = SourceOffset.from_dict(end)
        fresh = self._fresh_start_offsets(
            [name for name, stop in stops.items() if _is_fresh(begin.get(name), stop)])
        ranges = []
        for name, stop in sorted(stops.items()):
            position = fresh[name] if name in fresh else begin.get(name) or 0
            ranges.append(OffsetRange(name, min(position, stop), stop))
        pieces = split_ranges(
            ranges,
            max_records_per_partition=self._options.max_records_per_partition,
            min_partitions=self._options.min_partitions,
            parallelism=self._options.parallelism,
        )
        log.debug("planned %d partitions for %s -> %s", len(pieces), start, end)
        read_from = {r.stream: r.start for r in ranges}
        return [RangePartition(p.stream, p.start, p.end, read_from[p.stream]) for p in pieces]

    def _fresh_start_offsets(self, names: list[str]) -> dict[str, int]:
        """Earliest offsets of joined/re-created streams: as latestOffset saw them or,
        when the batch is re-planned after a restart, as the broker has them now."""
        current: Bounds = {}
        if any(name not in self._fresh_starts for name in names):
            current = subscribed_bounds(self.client, self._options)
        return {name: self._fresh_starts[name] if name in self._fresh_starts
                else current.get(name, (0, 0))[0] for name in names}

    # ------------------------------------------------------------ executor

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_partition(self._options, partition, schema=self._schema)

    # ------------------------------------------------------------ driver: progress

    def commit(self, end: dict[str, int]) -> None:
        """Mirror the processed position into the group, if one is set (best effort)."""
        self._record_group_position(SourceOffset.from_dict(end))

    def _record_group_position(self, position: SourceOffset) -> None:
        if self._options.group is None:
            return
        from npstream.errors import NpstreamError

        for name, offset in sorted(position.items()):
            if self._group_positions.get(name) == offset:
                continue
            try:
                commit_group_position(self.client, name, self._options.group, offset)
            except NpstreamError as exc:
                log.warning("could not commit offset %d of stream '%s' to group '%s': %s "
                            "(the checkpoint still has it)", offset, name,
                            self._options.group, exc)
                continue
            self._group_positions[name] = offset

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _is_fresh(position: int | None, end: int) -> bool:
    """A stream read from its earliest offset: new to the query, or re-created."""
    return position is None or position > end


def commit_group_position(client: Client, stream: str, group: str, next_offset: int) -> None:
    """Set the group's position to ``next_offset``, creating the group when it is new."""
    from npstream.client import group_rpc
    from npstream.errors import GroupNotFound, StreamNotFound
    from npstream.proto import pb

    try:
        group_rpc.commit(client, stream, group, next_offset=next_offset)
    except StreamNotFound:
        log.debug("not committing group '%s': stream '%s' no longer exists", group, stream)
    except GroupNotFound:
        group_rpc.open_consumer(client, stream, group, pb.StartFrom(offset=next_offset))
        group_rpc.commit(client, stream, group, next_offset=next_offset)

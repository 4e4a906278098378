"""Result types of the client SDK: frozen dataclasses built from the wire messages.

They mirror the protobuf messages field by field (times stay epoch ms, so no
precision is lost) and add ``datetime`` views in UTC for people reading them;
reprs show both.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import pyarrow as pa

from npstream.client.values import ms_to_iso
from npstream.errors import NpstreamError
from npstream.proto import pb
from npstream.proto.stream_config import StreamConfig
from npstream.proto.units import datetime_from_ms
from npstream.proto.value_schema import deserialize_schema

__all__ = [
    "BatchPublishResult",
    "PublishManyResult",
    "PublishResult",
    "RepairResult",
    "SchemaVersion",
    "StreamActivity",
    "StreamConfig",
    "StreamInfo",
    "StreamStats",
]


def _datetime(ms: int) -> dt.datetime | None:
    return datetime_from_ms(ms) if ms else None


def _show_ms(ms: int) -> str:
    return f"{ms} ({ms_to_iso(ms)})" if ms else "0"


@dataclass(frozen=True, repr=False)
class SchemaVersion:
    """One version of a typed stream's value schema (docs/typed-streams.md).

    ``schema`` is the value's fields as a pyarrow schema, ``ddl`` the same in
    the broker's canonical DDL.
    """

    version: int
    ddl: str
    schema: pa.Schema
    created_ms: int

    @classmethod
    def from_pb(cls, message: pb.ValueSchema) -> SchemaVersion:
        return cls(message.version, message.ddl, deserialize_schema(message.arrow_schema),
                   message.created_ms)

    @property
    def created(self) -> dt.datetime | None:
        return _datetime(self.created_ms)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (the schema as its DDL)."""
        return {"version": self.version, "ddl": self.ddl, "created_ms": self.created_ms,
                "created": ms_to_iso(self.created_ms) if self.created_ms else None}

    def __repr__(self) -> str:
        return (f"SchemaVersion(version={self.version}, ddl={self.ddl!r}, "
                f"created_ms={_show_ms(self.created_ms)})")


@dataclass(frozen=True, repr=False)
class StreamInfo:
    """What the broker knows about one stream: offsets, size, times, config, schema.

    ``end_offset`` is the next offset to be written; the retained messages are
    ``[start_offset, end_offset)``. ``error`` is non-empty when the stream
    needs ``repair_stream``. A typed stream has ``value_schema`` (its current
    value fields) and ``schema_versions`` (every version, oldest first); an
    untyped one None and ``[]``.
    """

    name: str
    config: StreamConfig
    start_offset: int
    end_offset: int
    message_count: int
    bytes_on_disk: int
    first_timestamp_ms: int
    last_timestamp_ms: int
    created_ms: int
    segment_count: int
    error: str = ""
    value_schema: pa.Schema | None = None
    schema_versions: list[SchemaVersion] = field(default_factory=list)

    @classmethod
    def from_pb(cls, message: pb.StreamInfo) -> StreamInfo:
        versions = [SchemaVersion.from_pb(v) for v in message.value_schemas]
        return cls(
            name=message.name,
            config=StreamConfig.from_pb(message.config),
            start_offset=message.start_offset,
            end_offset=message.end_offset,
            message_count=message.message_count,
            bytes_on_disk=message.bytes_on_disk,
            first_timestamp_ms=message.first_timestamp_ms,
            last_timestamp_ms=message.last_timestamp_ms,
            created_ms=message.created_ms,
            segment_count=message.segment_count,
            error=message.error,
            value_schema=versions[-1].schema if versions else None,
            schema_versions=versions,
        )

    @property
    def first_timestamp(self) -> dt.datetime | None:
        """Append time of the first retained message (UTC), None when empty."""
        return _datetime(self.first_timestamp_ms)

    @property
    def last_timestamp(self) -> dt.datetime | None:
        """Append time of the last message (UTC), None when empty."""
        return _datetime(self.last_timestamp_ms)

    @property
    def created(self) -> dt.datetime | None:
        return _datetime(self.created_ms)

    @property
    def value_schema_ddl(self) -> str | None:
        """The current value schema as DDL; None for an untyped stream."""
        return self.schema_versions[-1].ddl if self.schema_versions else None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (nested config, times in ms plus ISO strings).

        ``value_schema`` is the current schema's DDL (None when untyped),
        ``schema_versions`` a list of SchemaVersion.to_dict().
        """
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["config"] = asdict(self.config)
        data["value_schema"] = self.value_schema_ddl
        data["schema_versions"] = [v.to_dict() for v in self.schema_versions]
        for name in ("first_timestamp", "last_timestamp", "created"):
            ms = data[f"{name}_ms"]
            data[name] = ms_to_iso(ms) if ms else None
        return data

    def __repr__(self) -> str:
        parts = [
            f"name={self.name!r}",
            f"start_offset={self.start_offset}",
            f"end_offset={self.end_offset}",
            f"message_count={self.message_count}",
            f"bytes_on_disk={self.bytes_on_disk}",
            f"first_timestamp_ms={_show_ms(self.first_timestamp_ms)}",
            f"last_timestamp_ms={_show_ms(self.last_timestamp_ms)}",
            f"created_ms={_show_ms(self.created_ms)}",
            f"segment_count={self.segment_count}",
            f"config={self.config!r}",
        ]
        if self.schema_versions:
            parts.append(f"value_schema={self.value_schema_ddl!r}")
            parts.append(f"schema_versions={self.schema_versions!r}")
        if self.error:
            parts.append(f"error={self.error!r}")
        return f"StreamInfo({', '.join(parts)})"


@dataclass(frozen=True)
class StreamActivity:
    """One stream and its traffic since the broker started (``Client.stream_stats``).

    In: messages stored by publishes and Spark sink commits, and the Arrow
    bytes of the publishes. Out: messages handed to readers (fetch,
    read_range, local reads, group pulls and deliveries) and the stored bytes
    of range reads. Counters, not rates: two calls apart give the rates.
    """

    info: StreamInfo
    messages_in: int
    bytes_in: int
    messages_out: int
    bytes_out: int


@dataclass(frozen=True)
class StreamStats:
    """``Client.stream_stats``: the streams, and the broker clock the counts were read at."""

    streams: list[StreamActivity]
    broker_time_ms: int   # when the counts were read
    broker_start_ms: int  # when they started (a restart resets them)

    @classmethod
    def from_pb(cls, message: pb.StreamStatsResponse) -> StreamStats:
        return cls(
            streams=[StreamActivity(StreamInfo.from_pb(a.stream), a.messages_in, a.bytes_in,
                                    a.messages_out, a.bytes_out) for a in message.streams],
            broker_time_ms=message.broker_time_ms,
            broker_start_ms=message.broker_start_ms,
        )


@dataclass(frozen=True)
class RepairResult:
    """Outcome of ``repair_stream``: the repaired stream and what was cut."""

    stream: StreamInfo
    truncated_bytes: int
    detail: str

    @classmethod
    def from_pb(cls, message: pb.RepairStreamResponse) -> RepairResult:
        return cls(StreamInfo.from_pb(message.stream), message.truncated_bytes, message.detail)


@dataclass(frozen=True)
class MoveResult:
    """Outcome of ``move_stream``: where the stream was and is, and what went with it."""

    stream: str
    source: str  # the broker that held it
    target: str  # the broker that holds it now
    end_offset: int
    groups: int  # groups that moved with it
    bytes: int  # bytes of message data copied
    already_there: bool  # it was on the target already: nothing was done
    paused_ms: int  # how long it took no writes
    # Dead-letter streams of its shared groups that moved with it.
    dead_letter_streams: tuple[str, ...] = ()

    @classmethod
    def from_pb(cls, message: pb.MoveStreamResponse) -> MoveResult:
        return cls(message.stream, message.source, message.target, message.end_offset,
                   message.groups, message.bytes, message.already_there, message.paused_ms,
                   tuple(message.dead_letter_streams))


@dataclass(frozen=True)
class PublishResult:
    """Offset of a published message; ``duplicate`` means it was already stored there."""

    offset: int
    duplicate: bool = False


@dataclass(frozen=True)
class PublishManyResult:
    """One entry's outcome in ``publish_many`` (results come in entry order).

    Stored (``error`` None): ``offsets[i]`` is the offset of the entry's
    message ``i`` (for a duplicate, of the copy stored earlier), ``offset``
    the first one's, and ``duplicates`` lists ``(message index, original
    offset)``. Not stored: ``error`` is the exception ``publish`` would have
    raised for this entry alone (InvalidArgument, PermissionDenied,
    MessageTooLarge, ...), and nothing of the entry was stored, except for a
    BrokerUnavailable, after which it may or may not have been (give messages
    ids to make a resend safe).
    """

    stream: str
    offsets: list[int] = field(default_factory=list)
    duplicates: list[tuple[int, int]] = field(default_factory=list)
    error: NpstreamError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def offset(self) -> int:
        """Offset of the entry's first message, -1 when it was not stored."""
        return self.offsets[0] if self.offsets and self.error is None else -1

    @property
    def duplicate(self) -> bool:
        """Whether the entry's first message was already stored (dedup by id)."""
        return bool(self.duplicates) and self.duplicates[0][0] == 0


@dataclass(frozen=True, repr=False)
class BatchPublishResult:
    """Outcome of ``publish_batch``.

    ``offsets[i]`` is the offset of input row ``i`` (for a duplicate, the
    offset of the copy stored earlier). ``duplicates`` lists ``(input index,
    original offset)``. ``first_offset`` is the offset of the first stored
    row, or -1 when every row was a duplicate. Rows of one call are in input
    order but need not be contiguous when the batch was split into several
    requests and other producers wrote in between.
    """

    first_offset: int
    stored_count: int
    duplicates: list[tuple[int, int]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)

    @property
    def last_offset(self) -> int:
        """Highest offset given to a row of this batch, -1 when empty."""
        return max(self.offsets) if self.offsets else -1

    def __repr__(self) -> str:
        shown = self.offsets if len(self.offsets) <= 6 else (
            f"[{self.offsets[0]}, {self.offsets[1]}, {self.offsets[2]}, ..., {self.offsets[-1]}] "
            f"({len(self.offsets)} rows)"
        )
        dups = self.duplicates if len(self.duplicates) <= 6 else (
            f"[{self.duplicates[0]}, ..., {self.duplicates[-1]}] ({len(self.duplicates)})"
        )
        return (
            f"BatchPublishResult(first_offset={self.first_offset}, "
            f"stored_count={self.stored_count}, duplicates={dups}, offsets={shown})"
        )

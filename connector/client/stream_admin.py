"""The streams part of ``npstream.Client``: create, describe, list, change, delete, repair.

Kept apart from publishing and reading because it is the control plane:
small unary calls whose arguments (names, durations, sizes) are checked here
so that a mistake fails before a round trip, and whose effects are logged
(docs/client.md, "Logging") since they change what every other client sees.
"""

from __future__ import annotations

import logging
from typing import TypeAlias

import pyarrow as pa

from npstream.client.checks import Duration, Size, checked_offset, checked_stream, parsed
from npstream.client.core import ClientCore
from npstream.client.models import MoveResult, RepairResult, StreamInfo, StreamStats
from npstream.errors import InvalidArgumentType, InvalidSchema
from npstream.proto import pb
from npstream.proto.defaults import DEFAULT_LIST_PAGE_SIZE
from npstream.proto.units import parse_duration_ms, parse_size
from npstream.proto.value_schema import SchemaError, normalize_schema, to_ddl

__all__ = ["LIST_PAGE_SIZE", "StreamAdmin"]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- tuning
# How long move_stream waits for the broker's answer: a move copies the whole stream.
MOVE_TIMEOUT_S = 600.0
# Page size for ListStreams: the broker's default (its maximum is MAX_LIST_PAGE_SIZE).
LIST_PAGE_SIZE = DEFAULT_LIST_PAGE_SIZE


def _config(
    max_age: Duration | None,
    max_bytes: Size | None,
    dedup_window: Duration | None,
    max_message_bytes: Size | None,
) -> pb.StreamConfig:
    """A wire StreamConfig with only the given fields set (absent = broker default)."""
    config = pb.StreamConfig()
    if max_age is not None:
        config.max_age_ms = parsed(parse_duration_ms, "max_age", max_age)
    if max_bytes is not None:
        config.max_bytes = parsed(parse_size, "max_bytes", max_bytes)
    if dedup_window is not None:
        config.dedup_window_ms = parsed(parse_duration_ms, "dedup_window", dedup_window)
    if max_message_bytes is not None:
        config.max_message_bytes = parsed(parse_size, "max_message_bytes", max_message_bytes)
    return config


# A value schema as create_stream/update_stream take it: DDL or JSON text, or pyarrow.
SchemaLike: TypeAlias = str | pa.Schema


def _schema_text(schema: SchemaLike | None) -> str:
    """The wire form of a value schema: DDL or JSON text as given, a pyarrow schema as DDL.

    A pyarrow schema is checked here (InvalidSchema naming the field), text by
    the broker (the same parser, one round trip later).
    """
    if schema is None:
        return ""
    if isinstance(schema, pa.Schema):
        try:
            return to_ddl(normalize_schema(schema))
        except SchemaError as exc:
            raise InvalidSchema(f"schema: {exc}") from None
    if isinstance(schema, str):
        if not schema.strip():
            raise InvalidSchema("schema is empty: give DDL ('a INT, b STRING'), Spark's "
                                "StructType JSON or a pyarrow.Schema, or None for untyped")
        return schema
    raise InvalidArgumentType(
        "schema must be DDL or JSON text, a pyarrow.Schema or None, got "
        f"{type(schema).__name__}")


class StreamAdmin(ClientCore):
    """Stream lifecycle methods of ``Client`` (docs/client.md, "Streams")."""

    def create_stream(
        self,
        name: str,
        max_age: Duration | None = None,
        max_bytes: Size | None = None,
        dedup_window: Duration | None = None,
        max_message_bytes: Size | None = None,
        exist_ok: bool = False,
        schema: SchemaLike | None = None,
    ) -> StreamInfo:
        """Create a stream; with ``schema`` (DDL, JSON or pyarrow) a typed stream, version 1."""
        request = pb.CreateStreamRequest(
            name=checked_stream(name),
            config=_config(max_age, max_bytes, dedup_window, max_message_bytes),
            exist_ok=exist_ok,
            value_schema=_schema_text(schema),
        )
        info = StreamInfo.from_pb(self.call(lambda s: s.StreamService.CreateStream, request))
        log.info("created stream '%s' (or it existed): %s%s", info.name, info.config,
                 f", value schema '{info.value_schema_ddl}'" if info.schema_versions else "")
        return info

    def stream_info(self, name: str) -> StreamInfo:
        request = pb.DescribeStreamRequest(name=checked_stream(name))
        return StreamInfo.from_pb(self.call(lambda s: s.StreamService.DescribeStream, request))

    def list_streams(
        self, prefix: str | None = None, pattern: str | None = None
    ) -> list[StreamInfo]:
        """Every stream matching ``prefix`` and/or the glob ``pattern``, sorted by the broker."""
        streams: list[StreamInfo] = []
        token = ""
        while True:
            response = self.call(
                lambda s: s.StreamService.ListStreams,
                pb.ListStreamsRequest(
                    prefix=prefix or "", pattern=pattern or "", page_size=LIST_PAGE_SIZE,
                    page_token=token,
                ),
            )
            streams.extend(StreamInfo.from_pb(info) for info in response.streams)
            token = response.next_page_token
            if not token:
                return streams

    def stream_stats(self, pattern: str | None = "*",
                     streams: list[str] | tuple[str, ...] = ()) -> StreamStats:
        """The streams matching the glob ``pattern`` (default all) and the named ``streams``,
        each with its traffic since the broker started (one call; ``npstream top``).

        Only the streams the token may read; a named stream that does not exist
        is ``StreamNotFound``. Two calls apart give the rates.
        """
        request = pb.StreamStatsRequest(streams=[checked_stream(s) for s in streams],
                                        pattern=pattern or "")
        return StreamStats.from_pb(self.call(lambda s: s.StreamService.StreamStats, request))

    def update_stream(
        self,
        name: str,
        max_age: Duration | None = None,
        max_bytes: Size | None = None,
        dedup_window: Duration | None = None,
        max_message_bytes: Size | None = None,
        schema: SchemaLike | None = None,
    ) -> StreamInfo:
        """Change only the given settings (0 = unlimited/off); None leaves one as it is.

        ``schema``: a new value schema (DDL, JSON or pyarrow). An untyped stream
        becomes typed (only while it holds no messages); a typed one gets a new
        version when the change is compatible (IncompatibleSchema otherwise);
        the same schema changes nothing.
        """
        request = pb.UpdateStreamRequest(
            name=checked_stream(name),
            config=_config(max_age, max_bytes, dedup_window, max_message_bytes),
            value_schema=_schema_text(schema),
        )
        info = StreamInfo.from_pb(self.call(lambda s: s.StreamService.UpdateStream, request))
        log.info("updated stream '%s': %s%s", info.name, info.config,
                 f", value schema version {info.schema_versions[-1].version} "
                 f"'{info.value_schema_ddl}'" if schema is not None and info.schema_versions
                 else "")
        return info

    def delete_stream(self, name: str) -> bool:
        request = pb.DeleteStreamRequest(name=checked_stream(name))
        response = self.call(lambda s: s.StreamService.DeleteStream, request)
        log.info("deleted stream '%s': %s", name, response.deleted)
        return bool(response.deleted)

    def delete_messages(self, name: str, before_offset: int | None = None) -> StreamInfo:
        """Drop messages below ``before_offset`` (it becomes start_offset), or all when None."""
        request = pb.DeleteMessagesRequest(name=checked_stream(name))
        if before_offset is not None:
            request.before_offset = checked_offset("before_offset", before_offset,
                                                   "DeleteMessagesRequest.before_offset")
        info = StreamInfo.from_pb(self.call(lambda s: s.StreamService.DeleteMessages, request))
        log.info("deleted messages of stream '%s' before offset %s: now [%d, %d)",
                 name, "end" if before_offset is None else before_offset,
                 info.start_offset, info.end_offset)
        return info

    def move_stream(self, name: str, to: str, *, timeout: float = MOVE_TIMEOUT_S) -> MoveResult:
        """Move a stream to another broker of the cluster, ``to`` (its advertised host:port).

        The stream takes no writes while it is copied with its groups, dedup
        state and sink records (other clients' calls wait and go on at the new
        broker by themselves); returns once the new broker holds it. A move
        cut off by a crash is finished by the old broker when it runs again,
        or by calling this again (docs/broker.md "Moving a stream").
        """
        if not isinstance(to, str) or not to:
            raise InvalidArgumentType(f"to must be a broker address (host:port), got {to!r}")
        request = pb.MoveStreamRequest(stream=checked_stream(name), to=to)
        result = MoveResult.from_pb(self.call(lambda s: s.ClusterService.MoveStream, request,
                                              timeout=timeout))
        self.forget_brokers([name])
        log.info("moved stream '%s' from %s to %s (%d bytes, %d group(s), paused %d ms)%s",
                 name, result.source, result.target, result.bytes, result.groups,
                 result.paused_ms, " (it was there already)" if result.already_there else "")
        return result

    def repair_stream(self, name: str) -> RepairResult:
        request = pb.RepairStreamRequest(name=checked_stream(name))
        response = self.call(lambda s: s.StreamService.RepairStream, request)
        result = RepairResult.from_pb(response)
        log.warning("repaired stream '%s': truncated %d bytes at %s",
                    name, result.truncated_bytes, result.detail)
        return result

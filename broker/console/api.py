"""The web console's JSON: streams, one stream and its last messages, groups, history.

Every answer is built from the broker's own objects (registry, logs, group
manager, metric tallies), never over gRPC, and holds only streams the
caller's token may read (``readable``). The console is read-only: no route
changes anything. The routes (all GET):

- ``/api/overview``: broker-wide numbers (streams, groups, uptime, auth), and
  in a cluster this broker's member address and the members
- ``/api/streams``: every readable stream: offsets, sizes, rates in and out;
  in a cluster the other members' streams too, each row naming its member
  (asked over gRPC with the caller's token: npstream.broker.cluster.console_view)
- ``/api/streams/<name>``: config, stats, value schema versions, groups
- ``/api/streams/<name>/messages?limit=N[&offset=O | &time=T]``: the last N
  messages, or N messages from offset O or from time T (ISO-8601 or epoch
  ms); values decoded as JSON when they are JSON
- ``/api/groups[?stream=S]``: groups with lag, members, in-flight, dead letters
- ``/api/history``: the charts' series (history.py)
"""

from __future__ import annotations

import base64
import dataclasses
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from npstream.broker.console.tuning import (
    DEFAULT_MESSAGES,
    MAX_MESSAGE_BYTES,
    MAX_MESSAGES,
    MAX_STREAMS,
)
from npstream.broker.errors import BrokerError, OffsetOutOfRangeError, StreamNotFoundError
from npstream.broker.groups.group_collector import connected_members, lag_seconds
from npstream.broker.groups.typed_values import untyped_batch
from npstream.proto.frames.payload import decode_payload
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.proto.units import parse_timestamp_ms

if TYPE_CHECKING:
    from npstream.broker.cluster.console_view import ClusterView
    from npstream.broker.console.history import History
    from npstream.broker.groups.manager import GroupManager, GroupStatus
    from npstream.broker.server.metrics import BrokerMetrics
    from npstream.broker.streams.records import StreamStatus
    from npstream.broker.streams.registry import StreamRegistry

__all__ = ["ConsoleApi", "message_json"]

Readable = Callable[[str], bool]
Reply = tuple[int, object]



def _text_or_base64(data: bytes | None) -> dict[str, str] | None:
    if data is None:
        return None
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def message_json(row: dict[str, Any]) -> dict[str, Any]:
    """One stored message as the console shows it: the value as JSON when it parses."""
    value: bytes = row["value"] or b""
    shown: dict[str, Any]
    try:
        shown = {"json": json.loads(value)}
    except (ValueError, UnicodeDecodeError):
        shown = _text_or_base64(value) or {"text": ""}
    headers = {k: _text_or_base64(v) for k, v in (row.get("headers") or [])}
    timestamp = row["timestamp"]
    return {
        "offset": row["offset"], "id": row["id"], "key": _text_or_base64(row["key"]),
        "timestamp_ms": int(timestamp.timestamp() * 1000) if timestamp is not None else 0,
        "value": shown, "value_bytes": len(value), "headers": headers,
    }


class ConsoleApi:
    """Answers ``/api/...`` requests; stateless but for the history it reads."""

    def __init__(self, registry: StreamRegistry, groups: GroupManager | None,
                 metrics: BrokerMetrics, history: History, *, auth: bool,
                 clock: Callable[[], float] = time.time,
                 cluster: ClusterView | None = None) -> None:
        self._cluster = cluster
        self._registry = registry
        self._groups = groups
        self._metrics = metrics
        self._history = history
        self._auth = auth
        self._clock = clock

    def __call__(self, path: str, query: dict[str, str], readable: Readable,
                 token: bytes | None = None) -> Reply:
        parts = [p for p in path.split("/") if p][1:]  # after "api"
        try:
            if parts == ["overview"]:
                return 200, self.overview(readable)
            if parts == ["streams"]:
                return 200, self.streams(readable, query.get("prefix", ""), token)
            if len(parts) in (2, 3) and parts[0] == "streams":
                if not readable(parts[1]):  # as for a missing one: names are not disclosed
                    return 404, {"error": "not_found", "message": f"no stream '{parts[1]}'"}
                if len(parts) == 2:
                    return 200, self.stream(parts[1])
                if parts[2] == "messages":
                    return 200, self.messages(parts[1], query)
            if parts == ["groups"]:
                return 200, self.groups(readable, query.get("stream") or None)
            if parts == ["history"]:
                return 200, self._history.snapshot(readable)
        except StreamNotFoundError:
            return 404, {"error": "not_found", "message": f"no stream '{parts[1]}'"}
        except (ValueError, OffsetOutOfRangeError) as exc:
            return 400, {"error": "bad_request", "message": str(exc)}
        except BrokerError as exc:
            return 409, {"error": "unavailable", "message": str(exc)}
        return 404, {"error": "not_found", "message": f"no API route {path}"}

    # ------------------------------------------------------------ overview

    def overview(self, readable: Readable) -> dict[str, object]:
        names = [n for n in self._registry.matching() if readable(n)]
        groups = self._statuses(readable)
        return {
            "streams": len(names), "groups": len(groups),
            "lag_messages": sum(g.lag for g in groups),
            "started_ms": self._metrics.started_ms, "now_ms": int(self._clock() * 1000),
            "auth": self._auth, "history_interval_s": self._history.interval_s,
            "member": self._cluster.member if self._cluster is not None else "",
            "members": self._cluster.members if self._cluster is not None else [],
        }

    # ------------------------------------------------------------ streams

    def _stream_row(self, status: StreamStatus) -> dict[str, object]:
        activity = self._metrics.activity(status.name)
        row: dict[str, object] = {
            "name": status.name, "error": status.error, "typed": bool(status.schemas),
            "messages_in": activity.messages_in, "messages_out": activity.messages_out,
            "bytes_in": activity.bytes_in, "bytes_out": activity.bytes_out,
            "rate_in": self._history.recent_rate(status.name, "in"),
            "rate_out": self._history.recent_rate(status.name, "out"),
            "created_ms": status.created_ms,
            "member": self._cluster.member if self._cluster is not None else "",
        }
        if status.stats is not None:
            stats = status.stats
            row.update(start_offset=stats.start_offset, end_offset=stats.end_offset,
                       message_count=stats.end_offset - stats.start_offset,
                       bytes_on_disk=stats.bytes_on_disk, segments=stats.segment_count,
                       first_timestamp_ms=stats.first_timestamp_ms,
                       last_timestamp_ms=stats.last_timestamp_ms)
        return row

    def streams(self, readable: Readable, prefix: str = "",
                token: bytes | None = None) -> dict[str, object]:
        names = [n for n in self._registry.matching(prefix=prefix) if readable(n)]
        rows = []
        for name in names[:MAX_STREAMS]:
            try:
                rows.append(self._stream_row(self._registry.describe(name)))
            except StreamNotFoundError:  # deleted while listing
                continue
        total, unavailable = len(names), []
        if self._cluster is not None:
            others = self._cluster.other_streams(token, prefix)
            total += len(others.rows)
            rows = sorted([*rows, *others.rows], key=lambda row: str(row["name"]))
            unavailable = others.unavailable
        return {"streams": rows[:MAX_STREAMS], "total": total,
                "truncated": total > MAX_STREAMS, "unavailable_members": unavailable}

    def stream(self, name: str) -> dict[str, object]:
        status = self._registry.describe(name)
        row = self._stream_row(status)
        row["config"] = dataclasses.asdict(status.config)
        row["schemas"] = [{"version": v.version, "ddl": v.ddl, "created_ms": v.created_ms}
                          for v in status.schemas]
        row["groups"] = [self._group_row(g) for g in self._statuses(lambda s: s == name)]
        return row

    def messages(self, name: str, query: dict[str, str]) -> dict[str, object]:
        """A page of messages: the last ``limit``, or from ``offset`` / ``time`` on."""
        limit = int(query.get("limit") or DEFAULT_MESSAGES)
        if not 1 <= limit <= MAX_MESSAGES:
            raise ValueError(f"limit={limit} must be within 1..{MAX_MESSAGES}")
        stream_log = self._registry.get(name)
        start, end = stream_log.start_offset, stream_log.end_offset
        if query.get("time"):
            raw = query["time"]
            at_ms = parse_timestamp_ms(int(raw) if raw.isdigit() else raw)
            offset = stream_log.offset_for_timestamp(at_ms)
        elif query.get("offset"):
            offset = min(max(int(query["offset"]), start), end)
        else:
            offset = max(start, end - limit)
        rows: list[dict[str, object]] = []
        if offset < end:
            result = stream_log.read(offset, max_messages=limit, max_bytes=MAX_MESSAGE_BYTES,
                                     latest=True)
            schema = (stream_log.value_schemas.stored_schema(result.schema_version)
                      if result.schema_version else MESSAGE_SCHEMA)
            for data in result.batches:
                batch = decode_payload(data, schema)
                if result.schema_version:
                    batch = untyped_batch(batch)
                rows.extend(message_json(r) for r in batch.to_pylist()
                            if offset <= r["offset"] < offset + limit)
        return {"stream": name, "start_offset": start, "end_offset": end, "from_offset": offset,
                "messages": rows}

    # ------------------------------------------------------------ groups

    def _statuses(self, readable: Readable) -> list[GroupStatus]:
        return [] if self._groups is None else self._groups.statuses(readable)

    def _group_row(self, status: GroupStatus) -> dict[str, object]:
        assert self._groups is not None
        now_ms = self._clock() * 1000
        tally = self._groups.metrics.tally(status.stream, status.group)
        config = status.config
        return {
            "stream": status.stream, "group": status.group, "kind": status.kind or "-",
            "committed_offset": status.committed_offset, "end_offset": status.end_offset,
            "lag": status.lag,
            "lag_seconds": round(lag_seconds(self._groups.oldest_unconsumed_ms(status), now_ms),
                                 3),
            "in_flight": status.in_flight, "dead_lettered": status.dead_lettered,
            "dead_letter_stream": config.dead_letter_stream if config is not None else "",
            "max_deliver": config.max_deliver if config is not None else 0,
            "members": [{"member_id": m.member_id, "last_seen_ms": m.last_seen_ms,
                         "in_flight": m.in_flight, "connected": m.connections > 0}
                        for m in status.members],
            "members_connected": connected_members(status),
            "delivered": tally.delivered, "redelivered": tally.redelivered,
            "acked": tally.acked, "nacked": tally.nacked, "pulled": tally.pulled,
        }

    def groups(self, readable: Readable, stream: str | None = None) -> dict[str, object]:
        statuses = self._statuses(
            readable if stream is None else (lambda s: s == stream and readable(s)))
        return {"groups": [self._group_row(g) for g in statuses]}

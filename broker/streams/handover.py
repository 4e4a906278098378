"""The streams package's per-stream state as handover records (npstream.broker.handover).

Kinds, each version 1:

``stream.config``   the registry row: the config fields set explicitly and
                    the creation time (exactly one per stream).
``stream.schema``   one per value schema version: version, the Arrow IPC
                    schema message (base64), canonical DDL, creation time.
``stream.nursery``  a nursery stream's row (nursery.py): its first frame
                    (base64), end offset and timestamp, while it has no
                    directory yet.
``stream.stats``    the listing's kept stats of an idle stream
                    (listing_stats.py); valid on the other member because
                    the files travel byte for byte.

Installing writes the rows only; the registry takes the stream up
afterwards (``StreamRegistry.load_row``), once the caller's transaction
committed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from npstream.broker.handover import StateRecord, check_version, decode_bytes, encode_bytes
from npstream.broker.metadata import Metadata
from npstream.broker.storage import LogStats
from npstream.broker.streams.listing_stats import ListingStats
from npstream.broker.streams.records import overrides_of

__all__ = ["ListingStatsOwner", "StreamRowsOwner"]

CONFIG, SCHEMA, NURSERY, STATS = "stream.config", "stream.schema", "stream.nursery", "stream.stats"
_VERSION = 1  # of each kind above


class StreamRowsOwner:
    """The ``streams``, ``stream_schemas`` and ``nursery`` rows of a stream."""

    kinds = (CONFIG, SCHEMA, NURSERY)

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = metadata

    def export(self, stream: str, /) -> list[StateRecord]:
        rows = self._metadata.execute_tuples(
            "SELECT config_json, created_ms, end_floor FROM streams WHERE name = ?", (stream,))
        if not rows:
            return []
        records = [StateRecord(CONFIG, _VERSION, {"overrides": dict(overrides_of(rows[0][0])),
                                                  "created_ms": int(rows[0][1]),
                                                  "end_floor": int(rows[0][2])})]
        records += [StateRecord(SCHEMA, _VERSION, {
            "version": int(version), "arrow_schema": encode_bytes(bytes(arrow_schema)),
            "ddl": ddl, "created_ms": int(created_ms)})
            for version, arrow_schema, ddl, created_ms in self._metadata.execute_tuples(
                "SELECT version, arrow_schema, ddl, created_ms FROM stream_schemas "
                "WHERE stream = ? ORDER BY version", (stream,))]
        records += [StateRecord(NURSERY, _VERSION, {
            "frame": encode_bytes(bytes(frame)), "end_offset": int(end_offset),
            "timestamp_ms": int(timestamp_ms)})
            for frame, end_offset, timestamp_ms in self._metadata.execute_tuples(
                "SELECT frame, end_offset, timestamp_ms FROM nursery WHERE stream = ?",
                (stream,))]
        return records

    def install(self, stream: str, records: Sequence[StateRecord], txn: Metadata, /) -> None:
        for record in records:
            check_version(record, _VERSION)
            body = record.body
            if record.kind == CONFIG:
                # end_floor (end_floors.py): absent from a member of an older version.
                txn.execute("INSERT INTO streams (name, config_json, created_ms, end_floor) "
                            "VALUES (?, ?, ?, ?)",
                            (stream, json.dumps(body["overrides"], sort_keys=True),
                             int(body["created_ms"]), int(body.get("end_floor", 0))))
            elif record.kind == SCHEMA:
                txn.execute("INSERT INTO stream_schemas (stream, version, arrow_schema, ddl, "
                            "created_ms) VALUES (?, ?, ?, ?, ?)",
                            (stream, int(body["version"]), decode_bytes(body["arrow_schema"]),
                             str(body["ddl"]), int(body["created_ms"])))
            else:
                txn.execute("INSERT INTO nursery (stream, frame, end_offset, timestamp_ms) "
                            "VALUES (?, ?, ?, ?)",
                            (stream, decode_bytes(body["frame"]), int(body["end_offset"]),
                             int(body["timestamp_ms"])))

    def drop(self, stream: str, txn: Metadata, /) -> None:
        txn.execute("DELETE FROM nursery WHERE stream = ?", (stream,))
        txn.execute("DELETE FROM stream_schemas WHERE stream = ?", (stream,))
        txn.execute("DELETE FROM streams WHERE name = ?", (stream,))


class ListingStatsOwner:
    """The kept listing stats of a stream (listing_stats.py), buffered ones included."""

    kinds = (STATS,)

    def __init__(self, stats: ListingStats) -> None:
        self._stats = stats

    def export(self, stream: str, /) -> list[StateRecord]:
        kept = self._stats.get(stream)
        if kept is None:
            return []
        return [StateRecord(STATS, _VERSION, {
            "start_offset": kept.start_offset, "end_offset": kept.end_offset,
            "bytes": kept.bytes_on_disk, "first_ts": kept.first_timestamp_ms,
            "last_ts": kept.last_timestamp_ms, "segments": kept.segment_count})]

    def install(self, stream: str, records: Sequence[StateRecord], txn: Metadata, /) -> None:
        for record in records:
            check_version(record, _VERSION)
            body = record.body
            self._stats.write(stream, LogStats(
                int(body["start_offset"]), int(body["end_offset"]), int(body["bytes"]),
                int(body["first_ts"]), int(body["last_ts"]), int(body["segments"])), txn)

    def drop(self, stream: str, txn: Metadata, /) -> None:
        self._stats.forget(stream, txn)

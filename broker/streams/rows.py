"""The ``streams`` table: one row per stream (name, its config overrides, creation time).

The registry's records are these rows and their schema versions
(schemas.py) held in memory; this is where they are read at start (one
query, nothing per stream directory) and written. A stream's row is written
in one transaction with its schema rows, and schema rows a crash left under
its name are dropped there, so a new stream never inherits an old one's
schema versions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from npstream.broker.metadata import Metadata
from npstream.broker.streams.records import NewRow, StreamRecord, StreamState, overrides_of
from npstream.broker.streams.schemas import StreamSchemas

__all__ = ["StreamRows"]

# A stream's row and whether a nursery row (nursery.py) stands in for its directory (one
# stream: ``load``).
_SELECT = ("SELECT name, config_json, created_ms, "
           "EXISTS (SELECT 1 FROM nursery WHERE nursery.stream = streams.name) FROM streams")
_STATES = {False: StreamState.READY, True: StreamState.NURSERY}


class StreamRows:
    """Reads and writes of the ``streams`` table and, with a stream's row, its schema rows."""

    def __init__(self, metadata: Metadata, schemas: StreamSchemas) -> None:
        self._metadata = metadata
        self._schemas = schemas

    def load_all(self) -> dict[str, StreamRecord]:
        """Every stream's record (at start): NURSERY when it has a nursery row, else READY.

        Both tables are read in name order and merged here: a join would look
        each stream up in the nursery (about twice the read's time), and a set
        of the nursery's names would hold a copy of each for the whole read.
        """
        schemas = self._schemas.load_all()
        records: dict[str, StreamRecord] = {}
        with self._metadata.scan("SELECT stream FROM nursery ORDER BY stream") as nursery:
            waiting = next(nursery, None)  # the next nursery name, in the same order
            for name, config_json, created_ms in self._metadata.execute_tuples(
                    "SELECT name, config_json, created_ms FROM streams ORDER BY name"):
                while waiting is not None and waiting[0] < name:  # a row of no stream
                    waiting = next(nursery, None)
                in_nursery = waiting is not None and waiting[0] == name
                records[name] = StreamRecord(name, overrides_of(config_json), created_ms,
                                             tuple(schemas.get(name, ())), _STATES[in_nursery])
        return records

    def load(self, name: str) -> StreamRecord | None:
        """The stream's record as another module wrote its rows (a move in), or None."""
        rows = self._metadata.execute_tuples(f"{_SELECT} WHERE name = ?", (name,))
        if not rows:
            return None
        _name, config_json, created_ms, in_nursery = rows[0]
        return StreamRecord(name, overrides_of(config_json), created_ms,
                            self._schemas.load(name), _STATES[bool(in_nursery)])

    def insert(self, rows: Sequence[NewRow]) -> None:
        """Insert the streams' rows and their first schema versions in one transaction.

        Joins the caller's transaction when there is one (the nursery's
        durable one). Schema rows a crash left under these names go first.
        """
        with self._metadata.transaction():
            self._metadata.executemany(
                "INSERT INTO streams (name, config_json, created_ms) VALUES (?, ?, ?)",
                [(row.record.name, row.config_json, row.record.created_ms) for row in rows])
            self._schemas.drop(row.record.name for row in rows)
            for row in rows:
                if row.schema is not None:
                    self._schemas.insert(row.record.name, row.schema)

    def set_overrides(self, name: str, overrides: Mapping[str, int]) -> None:
        self._metadata.execute("UPDATE streams SET config_json = ? WHERE name = ?",
                               (json.dumps(overrides, sort_keys=True), name))

"""Typed streams' value schemas: the ``stream_schemas`` rows and the rules a new version obeys.

Typed streams (docs/typed-streams.md): the versions of a stream's value
schema are rows of ``stream_schemas`` (version, the value fields as an Arrow
IPC schema message, canonical DDL, creation time), written with the stream's
row at create, one more per compatible change, dropped with the stream.
Schemas are parsed and checked here (npstream.proto.value_schema); the
registry keeps the versions in its records and hands them to the stream's
log. An untyped stream becomes typed only while it holds no messages
(start_offset == end_offset): its stored bytes have no schema to be read in.
The registry makes that check and writes the new row under the log's append
lock, so no untyped append slips in between.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable

from npstream.broker.errors import (
    AlreadyExistsError,
    SchemaIncompatibleError,
    SchemaInvalidError,
)
from npstream.broker.metadata import Metadata
from npstream.broker.streams.records import SchemaVersion
from npstream.proto.value_schema import (
    IncompatibleSchemaError,
    SchemaError,
    check_evolution,
    deserialize_schema,
    parse_schema,
    serialize_schema,
    to_ddl,
)

__all__ = ["StreamSchemas", "check_becomes_typed", "refuse_other_schema"]

_TABLE = """
CREATE TABLE IF NOT EXISTS stream_schemas (
    stream       TEXT NOT NULL,
    version      INTEGER NOT NULL,  -- 1, 2, ...; stored frames record theirs
    arrow_schema BLOB NOT NULL,     -- the value's fields as an Arrow IPC schema message
    ddl          TEXT NOT NULL,     -- canonical DDL of the same schema
    created_ms   INTEGER NOT NULL,
    PRIMARY KEY (stream, version)
) WITHOUT ROWID
"""


def _version_of(row: sqlite3.Row) -> SchemaVersion:
    arrow_schema = bytes(row["arrow_schema"])
    return SchemaVersion(row["version"], deserialize_schema(arrow_schema), row["ddl"],
                         arrow_schema, row["created_ms"])


class StreamSchemas:
    """Every typed stream's schema versions in SQLite, and new versions checked before a row."""

    def __init__(self, metadata: Metadata, clock: Callable[[], int]) -> None:
        self._metadata = metadata
        self._clock = clock
        metadata.executescript(_TABLE)

    def load_all(self) -> dict[str, list[SchemaVersion]]:
        """Every stream's versions, oldest first (one query at start)."""
        schemas: dict[str, list[SchemaVersion]] = {}
        for row in self._metadata.execute("SELECT stream, version, arrow_schema, ddl, created_ms "
                                          "FROM stream_schemas ORDER BY stream, version"):
            schemas.setdefault(row["stream"], []).append(_version_of(row))
        return schemas

    def load(self, name: str) -> tuple[SchemaVersion, ...]:
        """The stream's versions, oldest first, as another module wrote them (a move in)."""
        return tuple(_version_of(row) for row in self._metadata.execute(
            "SELECT version, arrow_schema, ddl, created_ms FROM stream_schemas "
            "WHERE stream = ? ORDER BY version", (name,)))

    def insert(self, name: str, entry: SchemaVersion) -> None:
        self._metadata.execute(
            "INSERT INTO stream_schemas (stream, version, arrow_schema, ddl, created_ms) "
            "VALUES (?, ?, ?, ?, ?)",
            (name, entry.version, entry.arrow_schema, entry.ddl, entry.created_ms),
        )

    def drop(self, names: Iterable[str]) -> None:
        """Delete the streams' rows: with a deleted stream, or left by a crash before a create."""
        self._metadata.executemany("DELETE FROM stream_schemas WHERE stream = ?",
                                   [(name,) for name in names])

    def new_version(self, name: str, text: str, version: int) -> SchemaVersion:
        """Schema version ``version`` from DDL or JSON text; SchemaInvalidError if it is not one."""
        try:
            schema = parse_schema(text)
        except SchemaError as exc:
            raise SchemaInvalidError(f"value schema of stream '{name}': {exc}") from None
        return SchemaVersion(version, schema, to_ddl(schema), serialize_schema(schema),
                             self._clock())

    def evolve(self, name: str, versions: tuple[SchemaVersion, ...],
               text: str) -> SchemaVersion | None:
        """The version after ``versions`` that ``text`` makes, or None when it is the latest.

        SchemaInvalidError when it does not parse; SchemaIncompatibleError when
        the evolution rules refuse it.
        """
        latest = versions[-1] if versions else None
        entry = self.new_version(name, text, latest.version + 1 if latest else 1)
        if latest is not None:
            if entry.schema.equals(latest.schema):
                return None
            try:
                check_evolution(latest.schema, entry.schema)
            except IncompatibleSchemaError as exc:
                raise SchemaIncompatibleError(
                    f"value schema of stream '{name}' cannot change from '{latest.ddl}' "
                    f"(version {latest.version}) to '{entry.ddl}': {exc}"
                ) from None
        return entry


def check_becomes_typed(name: str, start: int, end: int) -> None:
    """SchemaIncompatibleError when an untyped stream holding [start, end) would become typed."""
    if end > start:
        raise SchemaIncompatibleError(
            f"stream '{name}' holds {end - start} untyped message(s) (offsets "
            f"[{start}, {end})): an untyped stream becomes typed only while it "
            "holds no messages, since stored bytes have no schema to be read "
            "in; delete its messages first (delete_messages) or use a new stream"
        )


def refuse_other_schema(name: str, existing: tuple[SchemaVersion, ...],
                        requested: SchemaVersion | None) -> None:
    """AlreadyExistsError when a create asks for another schema than the stream's latest."""
    latest = existing[-1] if existing else None
    same_schema = (requested.schema.equals(latest.schema) if requested and latest
                   else requested is None and latest is None)
    if not same_schema:
        shown_have = f"'{latest.ddl}' (version {latest.version})" if latest else "none"
        shown_wanted = f"'{requested.ddl}'" if requested else "none"
        raise AlreadyExistsError(
            f"stream '{name}' already exists with a different value schema: existing "
            f"{shown_have}, requested {shown_wanted}; pass exist_ok to keep the "
            "existing one, or update_stream to evolve the schema"
        )

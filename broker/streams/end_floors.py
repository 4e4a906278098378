"""A durable lower bound of each stream's end offset, kept in its ``streams`` row.

Offsets are never reused (docs/guarantees.md). ``log-extent`` guards a log
against losing files, but it lives in the stream's directory: with the whole
directory removed, the registry's row alone remained and the stream reopened
empty at offset 0, handing out offsets it had acknowledged before. So the row
records ``end_floor``, an end offset the stream had reached, and the registry
refuses to open a stream whose directory is missing or whose log ends below it
(the stream needs repair; registry.py).

It is written at moments that cost nothing on the publish path: when the
broker stops cleanly (every open log's end, one transaction, after the logs
were fsynced and closed), when a log is closed by the registry (a move's
pause), and when messages are deleted. Never per publish: it is a lower bound,
and after a crash it is the end of the last clean stop. It is lowered only by
repair (which documents what it accepts) and set to 0 before a stream's files
are dropped, so a crash in the middle of a delete leaves an empty stream, not
a refused one. Moves carry it (handover.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from npstream.broker.metadata import Metadata

__all__ = ["EndFloors"]


class EndFloors:
    """Reads and writes of the ``end_floor`` column of the ``streams`` table."""

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = metadata
        columns = {row[1] for row in metadata.execute_tuples("PRAGMA table_info(streams)")}
        if "end_floor" not in columns:  # a data dir from before the column
            metadata.execute("ALTER TABLE streams ADD COLUMN end_floor INTEGER NOT NULL DEFAULT 0")

    def get(self, name: str) -> int:
        """The stream's recorded end floor (0: none)."""
        rows = self._metadata.execute_tuples("SELECT end_floor FROM streams WHERE name = ?",
                                             (name,))
        return int(rows[0][0]) if rows else 0

    def raise_to(self, ends: Mapping[str, int]) -> None:
        """Record these ends (a floor only ever rises here), in one transaction."""
        if ends:
            self._metadata.executemany(
                "UPDATE streams SET end_floor = MAX(end_floor, ?) WHERE name = ?",
                [(end, name) for name, end in ends.items()])

    def set(self, name: str, end: int) -> None:
        """Put the floor at ``end``, lower or not (repair, delete)."""
        self._metadata.execute("UPDATE streams SET end_floor = ? WHERE name = ?", (end, name))

    def recorded(self) -> list[tuple[str, int]]:
        """(name, floor) of every stream with a floor and no nursery row (the start's check)."""
        return [(str(name), int(floor)) for name, floor in self._metadata.execute_tuples(
            "SELECT name, end_floor FROM streams WHERE end_floor > 0 AND NOT EXISTS "
            "(SELECT 1 FROM nursery WHERE nursery.stream = streams.name)")]

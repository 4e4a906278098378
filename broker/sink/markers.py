"""What a sink commit records in SQLite, each record durable before the bytes it describes.

A commit must survive a broker crash at any point and be finished exactly
once at the restart (recovery.py). That works only if, when the crash
comes, SQLite already says what the log's files may hold. So every commit
leaves these records (through ``ctx.metadata``):

``sink_state``    one row per sink: the last committed batch id.
``sink_pending``  the commit in progress of a sink: its batch, the staging ids
                  listed by the driver and the target streams. Recorded
                  (durably) before the first byte is appended, deleted in the
                  same transaction that records the batch as committed.
``sink_markers``  one row per (commit, stream): ``first_offset`` and
                  ``row_count`` of the rows being appended, ``state``
                  'committing' while the append may be incomplete, 'done' once
                  it returned (fsynced), and the append's timestamp (reused
                  when recovery resumes the append).
``sink_floors``   per (sink, stream) the last batch whose rows for that stream
                  are in it already, written when the stream moved here from
                  another member of a cluster (cluster/move.py): a replayed
                  batch up to the floor appends nothing to that stream.

Markers and the pending row must be durable before the log bytes they
describe. With ``metadata_sync = "normal"`` SQLite does not fsync its WAL on
commit (a process crash keeps it, a power loss may not), so a WAL checkpoint
(which syncs the WAL) follows each 'committing' marker, the pending row and
the final transaction; with "full" every commit is synced already.

Every change of one sink's records and staging (commit, abort, recovery,
GC) happens under that sink's lock (``lock``), so they never interleave.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from npstream.broker.metadata import Metadata

__all__ = ["SCHEMA", "Marker", "Pending", "SinkMarkers", "now_ms"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS sink_state (
    sink_id       TEXT PRIMARY KEY,
    last_batch_id INTEGER NOT NULL,
    committed_ms  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sink_pending (
    sink_id     TEXT PRIMARY KEY,
    batch_id    INTEGER NOT NULL,
    staging_ids TEXT NOT NULL,      -- JSON list, in commit order
    streams     TEXT NOT NULL,      -- JSON list of target streams, sorted
    started_ms  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sink_markers (
    sink_id      TEXT NOT NULL,
    batch_id     INTEGER NOT NULL,
    stream       TEXT NOT NULL,
    first_offset INTEGER NOT NULL,
    row_count    INTEGER NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('committing', 'done')),
    timestamp_ms INTEGER,           -- the append's timestamp, reused if it is resumed
    PRIMARY KEY (sink_id, batch_id, stream)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sink_floors (
    sink_id       TEXT NOT NULL,
    stream        TEXT NOT NULL,
    last_batch_id INTEGER NOT NULL,
    PRIMARY KEY (sink_id, stream)
) WITHOUT ROWID;
"""


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Pending:
    """A commit in progress: recorded before its first byte, gone once it is committed."""

    sink_id: str
    batch_id: int
    staging_ids: list[str]
    streams: list[str]


@dataclass(frozen=True)
class Marker:
    """One stream's append of a pending commit."""

    first_offset: int
    row_count: int
    state: str
    timestamp: int | None  # the append's timestamp (None: recorded by an older broker)


class SinkMarkers:
    """The sink tables of one broker; thread-safe, with a lock per sink for its callers."""

    def __init__(self, metadata: Metadata, *, durable: bool = True,
                 clock: Callable[[], int] = now_ms) -> None:
        self._metadata = metadata
        self._durable = durable
        self._clock = clock
        self._locks_guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        metadata.executescript(SCHEMA)
        columns = {row[1] for row in metadata.execute("PRAGMA table_info(sink_markers)")}
        if "timestamp_ms" not in columns:  # created by an older broker
            metadata.execute("ALTER TABLE sink_markers ADD COLUMN timestamp_ms INTEGER")

    def lock(self, sink_id: str) -> threading.Lock:
        """The lock every change of this sink's records and staging holds."""
        with self._locks_guard:
            return self._locks.setdefault(sink_id, threading.Lock())

    # ------------------------------------------------------------ queries

    def last_batch_id(self, sink_id: str) -> int | None:
        rows = self._metadata.execute(
            "SELECT last_batch_id FROM sink_state WHERE sink_id = ?", (sink_id,))
        return int(rows[0][0]) if rows else None

    def is_committed(self, sink_id: str, batch_id: int) -> bool:
        """True when the batch is committed: staging for it would never be appended."""
        last = self.last_batch_id(sink_id)
        return last is not None and batch_id <= last

    def floor(self, sink_id: str, stream: str) -> int | None:
        """The last batch of this sink already in ``stream`` from before it moved here."""
        rows = self._metadata.execute(
            "SELECT last_batch_id FROM sink_floors WHERE sink_id = ? AND stream = ?",
            (sink_id, stream))
        return int(rows[0][0]) if rows else None

    def pending(self, sink_id: str) -> Pending | None:
        rows = self._metadata.execute(
            "SELECT batch_id, staging_ids, streams FROM sink_pending WHERE sink_id = ?",
            (sink_id,))
        if not rows:
            return None
        return Pending(sink_id, int(rows[0][0]), json.loads(rows[0][1]), json.loads(rows[0][2]))

    def all_pending(self) -> list[Pending]:
        rows = self._metadata.execute(
            "SELECT sink_id, batch_id, staging_ids, streams FROM sink_pending ORDER BY sink_id")
        return [Pending(r[0], int(r[1]), json.loads(r[2]), json.loads(r[3])) for r in rows]

    def marker(self, pending: Pending, stream: str) -> Marker | None:
        rows = self._metadata.execute(
            "SELECT first_offset, row_count, state, timestamp_ms FROM sink_markers "
            "WHERE sink_id = ? AND batch_id = ? AND stream = ?",
            (pending.sink_id, pending.batch_id, stream))
        if not rows:
            return None
        return Marker(int(rows[0][0]), int(rows[0][1]), rows[0][2],
                      None if rows[0][3] is None else int(rows[0][3]))

    # ------------------------------------------------------------ changes

    def begin(self, sink_id: str, batch_id: int, staging_ids: list[str],
              streams: list[str]) -> Pending:
        """Record a commit as pending, durably, before any of its bytes is appended."""
        pending = Pending(sink_id, batch_id, list(staging_ids), sorted(streams))
        self._metadata.execute(
            "INSERT INTO sink_pending (sink_id, batch_id, staging_ids, streams, started_ms) "
            "VALUES (?, ?, ?, ?, ?)",
            (sink_id, batch_id, json.dumps(pending.staging_ids), json.dumps(pending.streams),
             self._clock()))
        self._sync()
        return pending

    def record(self, pending: Pending, stream: str, first_offset: int, row_count: int,
               state: str, timestamp: int | None = None) -> None:
        """Record a stream's marker; a 'committing' one durably (before the append writes)."""
        self._metadata.execute(
            "INSERT OR REPLACE INTO sink_markers (sink_id, batch_id, stream, first_offset, "
            "row_count, state, timestamp_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (pending.sink_id, pending.batch_id, stream, first_offset, row_count, state,
             timestamp))
        if state == "committing":
            self._sync()

    def delete(self, pending: Pending, stream: str) -> None:
        """Forget a stream's marker: its append wrote nothing (others may append there now)."""
        self._metadata.execute(
            "DELETE FROM sink_markers WHERE sink_id = ? AND batch_id = ? AND stream = ?",
            (pending.sink_id, pending.batch_id, stream))

    def mark_done(self, pending: Pending, stream: str) -> None:
        self._metadata.execute(
            "UPDATE sink_markers SET state = 'done' WHERE sink_id = ? AND batch_id = ? "
            "AND stream = ?", (pending.sink_id, pending.batch_id, stream))

    def finish(self, pending: Pending) -> None:
        """Record the batch as committed and forget the commit's pending row and markers."""
        with self._metadata.transaction():
            self._metadata.execute(
                "INSERT INTO sink_state (sink_id, last_batch_id, committed_ms) VALUES (?, ?, ?) "
                "ON CONFLICT (sink_id) DO UPDATE SET last_batch_id = excluded.last_batch_id, "
                "committed_ms = excluded.committed_ms",
                (pending.sink_id, pending.batch_id, self._clock()))
            self._metadata.execute("DELETE FROM sink_pending WHERE sink_id = ?",
                                   (pending.sink_id,))
            self._metadata.execute("DELETE FROM sink_markers WHERE sink_id = ?",
                                   (pending.sink_id,))
        self._sync()

    def forget_stream(self, stream: str) -> None:
        """A deleted stream: drop it from unfinished commits and forget its markers."""
        for pending in self.all_pending():
            if stream in pending.streams:
                with self.lock(pending.sink_id):
                    remaining = [s for s in pending.streams if s != stream]
                    self._metadata.execute(
                        "UPDATE sink_pending SET streams = ? WHERE sink_id = ?",
                        (json.dumps(remaining), pending.sink_id))
        self._metadata.execute("DELETE FROM sink_markers WHERE stream = ?", (stream,))
        self._metadata.execute("DELETE FROM sink_floors WHERE stream = ?", (stream,))

    def _sync(self) -> None:
        """Make what was just committed to SQLite survive a power loss (module doc)."""
        if self._durable:
            self._metadata.execute("PRAGMA wal_checkpoint(PASSIVE)")

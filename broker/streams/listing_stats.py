"""What listings report for idle streams, kept in SQLite so a listing reads no stream files.

Streams as cheap as keys (docs/scaling.md): a listing describes each
stream of its page. An idle stream was described from its files
(storage/peek.py: a directory listing and a read of its segment), which is a
disk read per stream once the kernel has dropped them from its caches: 4.3 s
for a cold listing of 10,000 at a million streams. The stats peek.py reads
are now kept as a row per stream (``stream_stats``), so the next listing of
that stream is a primary-key lookup.

Why a row is never stale: a stream's files change only through its open log.
The storage puts a row only for a stream that has no live log, under the
stream's name lock, and deletes it (``drop``) under the same lock before it
opens a log of that stream, drops or repairs it, or writes a nursery stream
out. Rows are buffered and written in batches; ``drop`` removes a buffered
row too, and a batch is written under the same lock ``drop`` takes, so a
drop always comes after any write of that row. Deletes are committed at once
(before the open goes on), so after kill -9 a stream that was open has no
row and is described from its files; an OS crash may lose the last deletes
(``metadata_sync = "normal"``): a stream opened just before one may be listed
with its stats from before that open until it is next opened. Damage done to
an idle stream's files from outside the broker shows when its log is next
opened (a read, a publish), not in a listing that finds a kept row.
"""

from __future__ import annotations

import threading

from npstream.broker.metadata import Metadata
from npstream.broker.storage import LogStats
from npstream.broker.streams.tuning import FLUSH_ROWS

__all__ = ["ListingStats"]

_TABLE = """
CREATE TABLE IF NOT EXISTS stream_stats (
    stream       TEXT PRIMARY KEY,  -- a stream with no open log when this was read
    start_offset INTEGER NOT NULL,
    end_offset   INTEGER NOT NULL,
    bytes        INTEGER NOT NULL,
    first_ts     INTEGER NOT NULL,
    last_ts      INTEGER NOT NULL,
    segments     INTEGER NOT NULL
) WITHOUT ROWID
"""


class ListingStats:
    """The storage's keeper of idle streams' stats (module docstring). Thread-safe."""

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = metadata
        metadata.executescript(_TABLE)
        self._lock = threading.Lock()
        self._pending: dict[str, LogStats] = {}

    def get(self, name: str) -> LogStats | None:
        """The kept stats of ``name``, or None."""
        pending = self._pending.get(name)
        if pending is not None:
            return pending
        rows = self._metadata.execute_tuples(
            "SELECT start_offset, end_offset, bytes, first_ts, last_ts, segments "
            "FROM stream_stats WHERE stream = ?", (name,))
        return LogStats(*rows[0]) if rows else None

    def put(self, name: str, stats: LogStats) -> None:
        """Keep ``stats`` for ``name``; the caller holds its name lock and it has no live log."""
        with self._lock:
            self._pending[name] = stats
            full = len(self._pending) >= FLUSH_ROWS
        if full:
            self.flush()

    def drop(self, name: str) -> None:
        """Forget ``name``'s stats before its files change (under its name lock)."""
        with self._lock:
            self._pending.pop(name, None)
            self._metadata.execute("DELETE FROM stream_stats WHERE stream = ?", (name,))

    def flush(self) -> None:
        """Write the buffered rows in one transaction."""
        with self._lock:
            if not self._pending:
                return
            self._metadata.executemany(_PUT, [_row(name, s) for name, s in self._pending.items()])
            self._pending.clear()

    # The two below run inside the caller's transaction, which holds the metadata
    # lock: they take no ``_lock`` (``flush`` takes it, then the metadata lock). The
    # caller's stream has no live log, so nothing puts its stats meanwhile.

    def write(self, name: str, stats: LogStats, txn: Metadata) -> None:
        """Keep ``stats`` for ``name`` now, in the caller's transaction (a stream moved in)."""
        self._pending.pop(name, None)
        txn.execute(_PUT, _row(name, stats))

    def forget(self, name: str, txn: Metadata) -> None:
        """``drop`` in the caller's transaction."""
        self._pending.pop(name, None)
        txn.execute("DELETE FROM stream_stats WHERE stream = ?", (name,))


_PUT = ("INSERT OR REPLACE INTO stream_stats (stream, start_offset, end_offset, bytes, "
        "first_ts, last_ts, segments) VALUES (?, ?, ?, ?, ?, ?, ?)")


def _row(name: str, s: LogStats) -> tuple[str, int, int, int, int, int, int]:
    return (name, s.start_offset, s.end_offset, s.bytes_on_disk, s.first_timestamp_ms,
            s.last_timestamp_ms, s.segment_count)

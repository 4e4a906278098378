"""The nursery: streams created by a first publish of one message, kept as SQLite rows.

Streams as cheap as keys (docs/scaling.md). A chat or a sensor
stream is created by publishing its first message, at thousands a second.
Giving each its directory and files before the ack cost ~1 ms of broker CPU
(mkdir, two file creations, the log objects), so creation stalled near
1,000/s. A stream whose first publish is one plain message (a value, no id,
key or headers) is instead created as two rows written in one transaction:
its ``streams`` row and a ``nursery`` row holding the exact frame its log
would have written at offset 0 (storage/first_frame.py). Such transactions
are group-committed by one writer thread (storage/group_commit.py, the
registry's) and fsynced (``durable_transaction``)
before any of their publishes is acknowledged, so ack=fsync keeps its promise
and a kill -9 right after the ack loses nothing.

A nursery stream has no directory. The registry writes its frame out as the
stream's first segment (then drops the row) before its log is first opened:
every reader, writer, group, move and repair goes through that open, so none
of them sees the difference. What needs no log is answered from the row:
listings and DescribeStream (stats equal to what the opened log reports),
EndOffsets. Deleting the stream deletes the row with the stream's row.
Retention: an expired nursery stream (its message older than the default
``max_age_ms``; nursery streams never have their own config, an update
writes them out first) is written out and left to the ordinary retention
pass, a slice per pass.
"""

from __future__ import annotations

from collections.abc import Iterable

from npstream.broker.metadata import Metadata
from npstream.broker.storage import LogStats
from npstream.broker.streams.tuning import EXPIRY_BATCH

__all__ = ["Nursery"]

_NURSERY_TABLE = """
CREATE TABLE IF NOT EXISTS nursery (
    stream       TEXT PRIMARY KEY,  -- a row of streams; no directory yet
    frame        BLOB NOT NULL,     -- the stored frame of offsets [0, end_offset)
    end_offset   INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL   -- the frame's (only) message timestamp
) WITHOUT ROWID
"""


class Nursery:
    """The nursery rows (module docstring). Thread-safe.

    Nothing of them is held in memory and nothing is read at start: whether a
    stream is in the nursery is a primary-key lookup, asked only where a log
    would otherwise be opened or described (~10 us against ~1 ms for an open).
    """

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = metadata
        metadata.executescript(_NURSERY_TABLE)
        self._sweep_after = ""  # the expiry sweep's place in name order

    def __contains__(self, name: object) -> bool:
        return bool(self._metadata.execute_tuples(
            "SELECT 1 FROM nursery WHERE stream = ?", (name,)))

    def insert(self, rows: Iterable[tuple[str, bytes, int, int]]) -> None:
        """(stream, frame, end_offset, timestamp_ms) rows; inside the caller's transaction."""
        self._metadata.executemany(
            "INSERT OR REPLACE INTO nursery (stream, frame, end_offset, timestamp_ms) "
            "VALUES (?, ?, ?, ?)", rows)

    def frame_of(self, name: str) -> bytes | None:
        rows = self._metadata.execute_tuples("SELECT frame FROM nursery WHERE stream = ?",
                                             (name,))
        return bytes(rows[0][0]) if rows else None

    def stats_of(self, name: str) -> LogStats | None:
        """What the stream's log will report once written out; None: not in the nursery."""
        rows = self._metadata.execute_tuples(
            "SELECT length(frame), end_offset, timestamp_ms FROM nursery WHERE stream = ?",
            (name,))
        if not rows:
            return None
        size, end, timestamp = rows[0]
        return LogStats(0, end, size, timestamp, timestamp, 1)

    def forget(self, name: str) -> None:
        """Drop the row (written out, or the stream deleted; inside or outside a transaction)."""
        self._metadata.execute("DELETE FROM nursery WHERE stream = ?", (name,))

    def sweep_older_than(self, cutoff_ms: int) -> list[str]:
        """The names older than ``cutoff_ms`` among the next EXPIRY_BATCH rows in name order.

        A sweep over the whole nursery in slices, one per retention pass (no
        index on the timestamp: it would cost every create an index insert).
        """
        rows = self._metadata.execute_tuples(
            "SELECT stream, timestamp_ms FROM nursery WHERE stream > ? ORDER BY stream LIMIT ?",
            (self._sweep_after, EXPIRY_BATCH))
        self._sweep_after = rows[-1][0] if len(rows) == EXPIRY_BATCH else ""
        return [name for name, timestamp in rows if timestamp < cutoff_ms]

"""The nursery: streams created by a first publish of one message, kept as SQLite rows.

Streams as cheap as keys (issue 19, docs/scaling.md). A chat or a sensor
stream is created by publishing its first message, at thousands a second.
Giving each its directory and files before the ack cost ~1 ms of broker CPU
(mkdir, two file creations, the log objects), so creation stalled near
1,000/s. A stream whose first publish is one plain message (a value, no id,
key or headers) is instead created as two rows written in one transaction:
its ``streams`` row and a ``nursery`` row holding the exact frame its log
would have written at offset 0 (storage/first_frame.py). Such transactions
are group-committed by one writer thread and fsynced (``durable_transaction``)
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

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from npstream.broker.metadata import Metadata
from npstream.broker.storage import LogStats

__all__ = ["EXPIRY_BATCH", "GroupWriter", "Nursery", "Round"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Expired nursery streams written out per retention pass.
EXPIRY_BATCH = 2000

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


class Round:
    """One group written by a GroupWriter: set once written, with the error if it failed.

    Shared by every item of the group: one Event per group instead of one per
    item (building an Event per create was ~5% of its CPU).
    """

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None

    def wait(self) -> None:
        self.done.wait()
        if self.error is not None:
            raise self.error


class GroupWriter(Generic[T]):
    """One thread writing queued items in groups: ``write(group)`` per round.

    Unlike CommitQueue (storage/group_commit.py), ``submit`` does not wait: a
    PublishStream call's reader goes on to its next request while the items
    queue, so the replies of many calls share one transaction and one fsync.
    A round takes every item queued when it starts; ``write`` raising fails
    the whole round. The thread starts with the first item.
    """

    def __init__(self, write: Callable[[Sequence[T]], None], name: str) -> None:
        self._write = write
        self._name = name
        self._cond = threading.Condition()
        self._queue: list[T] = []
        self._round = Round()  # the round the queued items go into
        self._thread: threading.Thread | None = None
        self._idle = False  # the thread waits for items: the next submit wakes it

    def submit(self, item: T) -> Round:
        """Queue ``item``; the round that writes it (``wait`` on it)."""
        with self._cond:
            self._queue.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            if self._idle:  # only then: a wake-up per item cost ~7% of a create's CPU
                self._idle = False
                self._cond.notify()
            return self._round

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._idle = True
                    self._cond.wait()
                self._idle = False
                group, self._queue = self._queue, []
                current, self._round = self._round, Round()
            try:
                self._write(group)
            except BaseException as exc:
                current.error = exc
                log.error("%s: writing a group of %d failed: %s", self._name, len(group), exc)
            current.done.set()

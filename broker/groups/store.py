"""Group rows in the broker's SQLite metadata, and the writer that batches position updates.

One row per (stream, group): kind, committed offset, dead-lettered count and,
for shared groups, their settings. That row is everything about a group that
survives a restart; leases deliberately do not (after a restart unacked
messages are delivered again: at-least-once).

Positions change on every ack, so they are not written one by one:
``PositionWriter`` keeps the latest value per group and one background thread
writes all changed rows in one transaction. Callers that must report a
durable position wait for the write that covers their change (``wait``):
when no write is running the caller writes everything pending itself (the
group-commit leader), else it waits for the running write and leads the
next one, so a waited-for write costs no thread hand-off (the hand-off to the
writer thread and back would be most of a batch ack's time). Changes
nobody waits for (acks sent on Subscribe streams) are coalesced for a few
milliseconds first. Updates only
touch existing rows, and ``discard`` drops queued updates of a deleted group,
so a late write never resurrects a group.
"""

from __future__ import annotations

import builtins
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass

from npstream.broker.errors import DiskFullError, is_disk_full
from npstream.broker.groups.shared_config import SharedConfig
from npstream.broker.groups.tuning import (
    POSITION_FLUSH_INTERVAL_S,
    POSITION_WAIT_TIMEOUT_S,
    WRITER_IDLE_LOOK_S,
)
from npstream.broker.metadata import Metadata
from npstream.broker.storage.errors import GroupCommitClosedError
from npstream.broker.storage.group_commit import GroupCommit

__all__ = ["GroupRow", "GroupStore", "PositionWriter"]

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS consumer_groups (
    stream           TEXT NOT NULL,
    grp              TEXT NOT NULL,
    kind             TEXT NOT NULL DEFAULT '',  -- '' (positioned only), 'cursor', 'shared'
    committed_offset INTEGER NOT NULL,          -- next offset to read / lowest not acked
    dead_lettered    INTEGER NOT NULL DEFAULT 0,
    config_json      TEXT NOT NULL DEFAULT '',  -- shared groups: SharedConfig.to_json()
    created_ms       INTEGER NOT NULL,
    updated_ms       INTEGER NOT NULL,
    PRIMARY KEY (stream, grp)
) WITHOUT ROWID;
"""

_COLUMNS = "stream, grp, kind, committed_offset, dead_lettered, config_json, created_ms, updated_ms"

GroupKey = tuple[str, str]


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class GroupRow:
    """A group as stored: what survives a restart."""

    stream: str
    group: str
    kind: str
    committed_offset: int
    dead_lettered: int
    config: SharedConfig | None
    created_ms: int
    updated_ms: int


def _row(r: sqlite3.Row) -> GroupRow:
    return GroupRow(
        stream=r["stream"], group=r["grp"], kind=r["kind"],
        committed_offset=int(r["committed_offset"]),
        dead_lettered=int(r["dead_lettered"]),
        config=SharedConfig.from_json(r["config_json"]),
        created_ms=int(r["created_ms"]), updated_ms=int(r["updated_ms"]),
    )


class GroupStore:
    """CRUD of group rows; every method is one statement or one transaction."""

    def __init__(self, metadata: Metadata, clock: Callable[[], int] = _now_ms) -> None:
        self._metadata = metadata
        self._clock = clock
        metadata.executescript(_SCHEMA)

    def get(self, stream: str, group: str) -> GroupRow | None:
        rows = self._metadata.execute(
            f"SELECT {_COLUMNS} FROM consumer_groups WHERE stream = ? AND grp = ?",
            (stream, group),
        )
        return _row(rows[0]) if rows else None

    def list(self, stream: str) -> list[GroupRow]:
        rows = self._metadata.execute(
            f"SELECT {_COLUMNS} FROM consumer_groups WHERE stream = ? ORDER BY grp", (stream,)
        )
        return [_row(r) for r in rows]

    def count(self) -> int:
        """How many groups exist (all streams): the metrics' cap check, without loading any."""
        return int(self._metadata.execute("SELECT COUNT(*) AS n FROM consumer_groups")[0]["n"])

    def streams(self) -> builtins.list[str]:  # `list` here is the method above
        """Every stream that has at least one group row."""
        return [r["stream"] for r in self._metadata.execute(
            "SELECT DISTINCT stream FROM consumer_groups")]

    def create(self, stream: str, group: str, kind: str, committed_offset: int,
               config: SharedConfig | None = None) -> tuple[GroupRow, bool]:
        """(row, created): inserts the group unless it exists, then returns the stored row."""
        now = self._clock()
        with self._metadata.transaction():
            existing = self.get(stream, group)
            if existing is not None:
                return existing, False
            self._metadata.execute(
                f"INSERT INTO consumer_groups ({_COLUMNS}) VALUES (?, ?, ?, ?, 0, ?, ?, ?)",
                (stream, group, kind, committed_offset,
                 config.to_json() if config else "", now, now),
            )
        row = self.get(stream, group)
        assert row is not None
        return row, True

    def set_kind(self, stream: str, group: str, kind: str,
                 config: SharedConfig | None = None) -> None:
        self._metadata.execute(
            "UPDATE consumer_groups SET kind = ?, config_json = ?, updated_ms = ? "
            "WHERE stream = ? AND grp = ?",
            (kind, config.to_json() if config else "", self._clock(), stream, group),
        )

    def write_positions(self, updates: dict[GroupKey, tuple[int, int]]) -> None:
        """Store (committed_offset, dead_lettered) of several groups in one transaction."""
        now = self._clock()
        self._metadata.executemany(
            "UPDATE consumer_groups SET committed_offset = ?, dead_lettered = ?, updated_ms = ? "
            "WHERE stream = ? AND grp = ?",
            [(c, d, now, s, g) for (s, g), (c, d) in updates.items()],
        )

    def delete(self, stream: str, group: str) -> bool:
        with self._metadata.transaction():
            existed = self.get(stream, group) is not None
            self._metadata.execute(
                "DELETE FROM consumer_groups WHERE stream = ? AND grp = ?", (stream, group)
            )
        return existed

    def delete_stream(self, stream: str) -> int:
        with self._metadata.transaction():
            count = len(self.list(stream))
            self._metadata.execute("DELETE FROM consumer_groups WHERE stream = ?", (stream,))
        return count


class _Positions(dict[GroupKey, tuple[int, int]]):
    """A round's positions, the latest per group, and the ticket of the latest put in it."""

    __slots__ = ("ticket",)

    def __init__(self) -> None:
        super().__init__()
        self.ticket = 0


def _requeue(failed: _Positions, later: _Positions) -> None:
    """A failed round's positions join the next round, where newer ones win."""
    for key, value in failed.items():
        later.setdefault(key, value)
    later.ticket = max(later.ticket, failed.ticket)


class PositionWriter:
    """Coalesces position updates into rounds of one transaction (see module docstring).

    The rounds are storage/group_commit.py's: a waiting caller leads the
    write, a thread writes what nobody waits for after ``interval_s``, and a
    failed round's positions stay queued for the thread's retry.
    """

    def __init__(self, store: GroupStore,
                 interval_s: float = POSITION_FLUSH_INTERVAL_S) -> None:
        self._store = store
        self._tickets = 0  # ticket of the latest put
        self._written = 0  # every put up to this ticket is in SQLite
        self._closed = False
        self._last_error: Exception | None = None  # of the latest write, None once one succeeds
        self._commit: GroupCommit[tuple[GroupKey, tuple[int, int]], _Positions] = GroupCommit(
            self._write, _Positions, self._add, thread_name="npstream-group-positions",
            linger_s=interval_s, retry_pause_s=max(interval_s, 0.1),
            idle_look_s=WRITER_IDLE_LOOK_S, requeue=_requeue)

    def _add(self, positions: _Positions, item: tuple[GroupKey, tuple[int, int]]) -> None:
        """Under the rounds' lock, so tickets grow in round order."""
        key, value = item
        positions[key] = value
        self._tickets += 1
        positions.ticket = self._tickets

    def put(self, stream: str, group: str, committed_offset: int, dead_lettered: int, *,
            wake_writer: bool = True) -> int:
        """Queue the group's new position; returns a ticket for ``wait`` (0: closed).

        ``wake_writer=False`` when the caller waits for the ticket (it writes
        then, as the group-commit leader): waking the writer thread for a
        write it will not make cost a thread wake-up and a turn at the lock
        per batch ack. The thread looks at least every WRITER_IDLE_LOOK_S anyway.
        """
        try:
            round_ = self._commit.submit(((stream, group), (committed_offset, dead_lettered)),
                                         wake=wake_writer)
        except GroupCommitClosedError:
            return 0
        return round_.batch.ticket  # this put's or a later one's of the same round

    def wait(self, ticket: int, timeout: float = POSITION_WAIT_TIMEOUT_S) -> bool:
        """Block until the put with this ticket is written; False on timeout.

        Leads the write when none is running (see the module doc). When the
        round holding the ticket fails, its positions stay queued for the
        writer thread's retry and the caller gets the error (DiskFullError
        when the disk is full) instead of a durable position: retrying the
        write here at once would spin until space is freed.
        """
        deadline = time.monotonic() + timeout
        while self._written < ticket and not self._closed:
            round_ = self._commit.oldest()
            if round_ is None:
                return True  # nothing queued: the ticket's position was discarded
            try:
                if not self._commit.wait(round_, deadline - time.monotonic()):
                    return False
            except Exception as exc:
                if round_.batch.ticket >= ticket:
                    raise self._write_error(exc, round_.batch) from None
        return True

    def _write(self, positions: _Positions) -> None:
        """Flush of a round: one transaction; logs once per failing streak."""
        try:
            if positions:
                self._store.write_positions(positions)
        except Exception as exc:
            if self._last_error is None:
                log.error("writing %d group position(s) failed; retrying", len(positions),
                          exc_info=exc)
            self._last_error = exc
            raise
        if self._last_error is not None:
            log.info("group positions written again after a failed write")
            self._last_error = None
        self._written = max(self._written, positions.ticket)

    @staticmethod
    def _write_error(exc: Exception, positions: _Positions) -> Exception:
        """What a waiter raises for a failed write (its change stays queued for the retry).

        A full disk is DiskFullError naming the group; anything else is the
        error itself (SQLite failing otherwise is a bug, reported as one).
        """
        if not is_disk_full(exc):
            return exc
        keys = list(positions)
        stream = keys[0][0] if len(keys) == 1 else ""
        groups = ", ".join(f"'{g}'" for _s, g in keys[:3]) + (" ..." if len(keys) > 3 else "")
        return DiskFullError(stream, f"writing the position of group {groups}", exc,
                             "the new position is kept and written once space is free, "
                             "but it is not durable yet")

    def discard(self, stream: str, group: str | None = None) -> None:
        """Drop queued updates of a group (or of every group of the stream)."""
        def drop(positions: _Positions) -> None:
            for key in [k for k in positions if k[0] == stream and group in (None, k[1])]:
                del positions[key]

        self._commit.amend(drop)

    def flush(self) -> None:
        """Write everything queued so far, now."""
        self.wait(self._tickets)

    def close(self) -> None:
        self.flush()
        self._closed = True
        self._commit.close(POSITION_WAIT_TIMEOUT_S)

"""The durable records of stream moves, and the gate that pauses a moving stream's calls.

A move (move.py) is a small state machine whose state lives in the source
member's metadata SQLite, table ``stream_moves``, so that a crash at any step
leaves a record saying what is true and what comes next:

``copying``    the stream takes no calls (STREAM_MOVING, retried by clients)
               while its files and metadata go to the target; this member
               owns it. Cancelling is still possible (nothing is installed).
``switching``  the copy is complete; the target is told to install it. From
               here on the move only goes forward (the target may hold the
               stream already), so this member never serves it again.
``removing``   the target holds the stream: this member redirects to it and
               deletes its own copy.
``done``       a tombstone: the stream left for ``target``. A sink commit
               whose staging predates the move is refused rather than
               re-creating the stream here (committer).

The target keeps ``moves_in`` rows (the moves it installed, by move id), so
that an install repeated after a crash answers "installed" instead of
failing, and the sink's per-stream floors (markers.py ``sink_floors``).

``MoveBook`` is the in-memory view of the unfinished records, read by
routing on every per-stream call, plus a gate counting each stream's calls
in flight: pausing a stream refuses new calls and waits for running ones,
so nothing writes while it is copied. Before the pause a move *drains* the
stream's sink stagings (move.py): new Stage calls into it are refused
(STREAM_MOVING) and counted while they write, while commits go on, so a
batch staged before the move can commit before the copy.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from npstream.broker.cluster.tuning import MOVE_RETRY_AFTER_MS
from npstream.broker.errors import StreamMovingError
from npstream.broker.metadata import Metadata

__all__ = ["ACTIVE_STATES", "SCHEMA", "MoveBook", "MoveRecord"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS stream_moves (
    stream     TEXT PRIMARY KEY,
    move_id    TEXT NOT NULL,
    target     TEXT NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('copying', 'switching', 'removing', 'done')),
    started_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS moves_in (
    stream       TEXT NOT NULL,
    move_id      TEXT NOT NULL,
    source       TEXT NOT NULL,
    installed_ms INTEGER NOT NULL,
    PRIMARY KEY (stream, move_id)
) WITHOUT ROWID;
"""

# States of an unfinished move (its stream is paused or redirected).
ACTIVE_STATES = ("copying", "switching", "removing")


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class MoveRecord:
    stream: str
    move_id: str
    target: str
    state: str
    started_ms: int


class MoveBook:
    """Move records of this member (source side) and the per-stream call gate. Thread-safe."""

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = metadata
        metadata.executescript(SCHEMA)
        self._cond = threading.Condition()
        self._active: dict[str, MoveRecord] = {}
        self._in_flight: dict[str, int] = {}
        self._draining: dict[str, str] = {}  # stream -> the member it is about to move to
        self._stages: dict[str, int] = {}  # Stage calls writing rows for the stream
        for row in metadata.execute(
                "SELECT stream, move_id, target, state, started_ms FROM stream_moves "
                "WHERE state != 'done'"):
            self._active[row[0]] = MoveRecord(row[0], row[1], row[2], row[3], int(row[4]))

    # ------------------------------------------------------------ records

    def active(self, stream: str) -> MoveRecord | None:
        """The unfinished move of ``stream`` (None: not moving)."""
        return self._active.get(stream)

    def unfinished(self) -> list[MoveRecord]:
        with self._cond:
            return list(self._active.values())

    def moved_away(self, stream: str) -> str | None:
        """The member ``stream`` left for when its move is done or removing (else None)."""
        record = self._active.get(stream)
        if record is not None:
            return record.target if record.state == "removing" else None
        rows = self._metadata.execute(
            "SELECT target FROM stream_moves WHERE stream = ? AND state = 'done'", (stream,))
        return str(rows[0][0]) if rows else None

    def begin(self, stream: str, target: str) -> MoveRecord:
        """Record a new move in state ``copying`` (durably): from now on the stream is paused."""
        now = _now_ms()
        record = MoveRecord(stream, uuid.uuid4().hex, target, "copying", now)
        with self._cond:
            self._metadata.execute(
                "INSERT OR REPLACE INTO stream_moves (stream, move_id, target, state, "
                "started_ms, updated_ms) VALUES (?, ?, ?, 'copying', ?, ?)",
                (stream, record.move_id, target, now, now))
            self._active[stream] = record
        return record

    def advance(self, record: MoveRecord, state: str) -> MoveRecord:
        """Record the move's next state (durably, before anything relies on it)."""
        moved = MoveRecord(record.stream, record.move_id, record.target, state,
                           record.started_ms)
        with self._cond:
            self._metadata.execute(
                "UPDATE stream_moves SET state = ?, updated_ms = ? WHERE stream = ? "
                "AND move_id = ?", (state, _now_ms(), record.stream, record.move_id))
            self._metadata.execute("PRAGMA wal_checkpoint(PASSIVE)")
            if state == "done":
                self._active.pop(record.stream, None)
            else:
                self._active[record.stream] = moved
            self._cond.notify_all()
        return moved

    def cancel(self, record: MoveRecord) -> None:
        """Forget a move that never reached ``switching``: the stream is served here again."""
        with self._cond:
            self._metadata.execute("DELETE FROM stream_moves WHERE stream = ? AND move_id = ?",
                                   (record.stream, record.move_id))
            self._active.pop(record.stream, None)
            self._cond.notify_all()

    def forget_tombstone(self, stream: str) -> None:
        """The stream is this member's again (moved back): its old ``done`` record goes."""
        self._metadata.execute("DELETE FROM stream_moves WHERE stream = ? AND state = 'done'",
                               (stream,))

    # ------------------------------------------------------------ the gate

    def check(self, stream: str) -> None:
        """StreamMovingError while ``stream`` is paused (copying or switching)."""
        record = self._active.get(stream)
        if record is not None and record.state in ("copying", "switching"):
            raise StreamMovingError(stream, record.target, MOVE_RETRY_AFTER_MS)

    @contextmanager
    def calling(self, stream: str) -> Iterator[None]:
        """Count a call on ``stream`` while it runs; StreamMovingError when it is paused."""
        with self._cond:
            self.check(stream)
            self._in_flight[stream] = self._in_flight.get(stream, 0) + 1
        try:
            yield
        finally:
            self.leave(stream)

    def enter(self, stream: str) -> None:
        """``calling`` without the context manager (a streaming call's request)."""
        with self._cond:
            self.check(stream)
            self._in_flight[stream] = self._in_flight.get(stream, 0) + 1

    def leave(self, stream: str) -> None:
        with self._cond:
            left = self._in_flight.get(stream, 0) - 1
            if left > 0:
                self._in_flight[stream] = left
            else:
                self._in_flight.pop(stream, None)
                self._cond.notify_all()

    def wait_idle(self, stream: str, timeout_s: float) -> bool:
        """Wait until no call on ``stream`` runs (paused: none starts); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._in_flight.get(stream, 0) > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    # ------------------------------------------------------------ sink stagings

    @contextmanager
    def staging(self, stream: str) -> Iterator[None]:
        """Around a Stage writing rows for ``stream``: StreamMovingError while the stream
        is drained for a move or paused; counted while it writes (``wait_stages``)."""
        with self._cond:
            target = self._draining.get(stream)
            if target is not None:
                raise StreamMovingError(stream, target, MOVE_RETRY_AFTER_MS)
            self.check(stream)
            self._stages[stream] = self._stages.get(stream, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                left = self._stages.get(stream, 0) - 1
                if left > 0:
                    self._stages[stream] = left
                else:
                    self._stages.pop(stream, None)
                    self._cond.notify_all()

    def drain(self, stream: str, target: str) -> None:
        """Refuse new Stage calls into ``stream`` (commits go on) until ``undrain``."""
        with self._cond:
            self._draining[stream] = target

    def undrain(self, stream: str) -> None:
        with self._cond:
            self._draining.pop(stream, None)

    def wait_stages(self, stream: str, timeout_s: float) -> bool:
        """Wait until no Stage writes rows for ``stream``; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._stages.get(stream, 0) > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    # ------------------------------------------------------------ target side

    def installed(self, stream: str, move_id: str) -> bool:
        """Whether this member installed ``move_id`` of ``stream`` (as its target)."""
        return bool(self._metadata.execute(
            "SELECT 1 FROM moves_in WHERE stream = ? AND move_id = ?", (stream, move_id)))

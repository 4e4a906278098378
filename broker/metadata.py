"""The broker's metadata database: one SQLite file in WAL mode, shared by every module.

Stream registry rows live here, and the groups and sink modules add their own
tables through the same object, so that everything that must survive a
restart (besides message data) is in one crash-safe place instead of a
hand-written journal. One connection guarded by a re-entrant lock: SQLite
serialises writers anyway, and the broker's metadata writes are small.

WAL with ``synchronous=NORMAL`` (the default ``metadata_sync``) keeps every
committed transaction across a process crash (kill -9); only an OS crash or
power loss can lose the last few. ``metadata_sync = "full"`` fsyncs every
commit for those too, at about one fsync per metadata write.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["METADATA_FILE", "Metadata"]

METADATA_FILE = "meta.sqlite3"

_STREAMS_TABLE = """
CREATE TABLE IF NOT EXISTS streams (
    name        TEXT PRIMARY KEY,
    config_json TEXT NOT NULL,  -- only fields set explicitly; others follow broker defaults
    created_ms  INTEGER NOT NULL,
    end_floor   INTEGER NOT NULL DEFAULT 0  -- streams/end_floors.py
) WITHOUT ROWID
"""


class Metadata:
    """Thread-safe access to ``<data_dir>/meta.sqlite3``.

    ``execute`` runs one statement (committed at once unless inside
    ``transaction()``) and returns all result rows as ``sqlite3.Row``.
    ``transaction()`` holds the lock for a BEGIN IMMEDIATE ... COMMIT block
    (ROLLBACK on exception); ``execute`` called inside it from the same thread
    joins the transaction.
    """

    def __init__(self, data_dir: Path, *, synchronous: str = "normal") -> None:
        self.path = Path(data_dir) / METADATA_FILE
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=30.0
        )
        self._conn.row_factory = sqlite3.Row
        self._in_transaction = False
        self._full_sync = synchronous == "full"
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._conn.execute(_STREAMS_TABLE)

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def execute_tuples(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """``execute`` with plain tuples for rows: for the queries that read a million."""
        with self._lock:
            cursor = self._conn.cursor()
            cursor.row_factory = None
            return cursor.execute(sql, params).fetchall()

    @contextmanager
    def scan(self, sql: str, params: Sequence[Any] = ()) -> Iterator[Iterator[tuple[Any, ...]]]:
        """A query's rows as tuples, read as they are iterated (the lock held meanwhile):
        for a read of a million rows at start that keeps no list of them."""
        with self._lock:
            cursor = self._conn.cursor()
            cursor.row_factory = None
            try:
                yield iter(cursor.execute(sql, params))
            finally:
                cursor.close()

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> int:
        """Run one statement for many parameter rows in one transaction; returns rows changed."""
        with self.transaction():
            return self._conn.executemany(sql, rows).rowcount

    def executescript(self, script: str) -> None:
        """Run DDL (CREATE TABLE IF NOT EXISTS ...) when a module starts."""
        with self._lock:
            self._conn.executescript(script)

    @contextmanager
    def transaction(self) -> Iterator[Metadata]:
        with self._lock:
            if self._in_transaction:  # nested: join the outer transaction
                yield self
                return
            self._conn.execute("BEGIN IMMEDIATE")
            self._in_transaction = True
            try:
                yield self
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            else:
                self._conn.execute("COMMIT")
            finally:
                self._in_transaction = False

    @contextmanager
    def durable_transaction(self) -> Iterator[Metadata]:
        """``transaction()`` whose commit is fsynced whatever ``metadata_sync`` says.

        For rows that stand in for fsynced message data (the registry's
        nursery: a new stream's first message, acknowledged with ack=fsync):
        the WAL is synced at this commit (``synchronous=FULL`` for it only).
        Not nested in another transaction.
        """
        with self._lock:
            if self._in_transaction:
                raise RuntimeError("durable_transaction inside a transaction")
            if not self._full_sync:
                self._conn.execute("PRAGMA synchronous=FULL")
            try:
                with self.transaction():
                    yield self
            finally:
                if not self._full_sync:
                    self._conn.execute("PRAGMA synchronous=NORMAL")

    def checkpoint(self) -> None:
        """Fold the WAL into the main file (done at shutdown)."""
        with self._lock:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

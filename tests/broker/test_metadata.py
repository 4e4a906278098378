"""Metadata: the SQLite API other broker modules build their tables on."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from npstream.broker.metadata import METADATA_FILE, Metadata


@pytest.fixture
def meta(tmp_path):
    m = Metadata(tmp_path)
    m.executescript("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v INTEGER)")
    yield m
    m.close()


def test_metadata_opens_in_wal_mode_with_the_streams_table(tmp_path, meta):
    assert meta.execute("PRAGMA journal_mode")[0][0] == "wal"
    assert (tmp_path / METADATA_FILE).exists()
    columns = [r["name"] for r in meta.execute("PRAGMA table_info(streams)")]
    assert columns == ["name", "config_json", "created_ms", "end_floor"]


def test_transaction_commits_on_success_and_rolls_back_on_error(meta):
    with meta.transaction():
        meta.execute("INSERT INTO t VALUES ('a', 1)")
        with meta.transaction():  # nested: joins the outer one
            meta.execute("INSERT INTO t VALUES ('b', 2)")
    with pytest.raises(sqlite3.IntegrityError), meta.transaction():
        meta.execute("INSERT INTO t VALUES ('c', 3)")
        meta.execute("INSERT INTO t VALUES ('a', 9)")  # duplicate key
    rows = meta.execute("SELECT k, v FROM t ORDER BY k")
    assert [tuple(r) for r in rows] == [("a", 1), ("b", 2)]


def test_executemany_and_rows_survive_reopen(tmp_path, meta):
    assert meta.executemany("INSERT INTO t VALUES (?, ?)", [("x", 1), ("y", 2)]) == 2
    meta.close()
    again = Metadata(tmp_path)
    assert [r["k"] for r in again.execute("SELECT k FROM t ORDER BY k")] == ["x", "y"]
    again.close()


def test_concurrent_transactions_from_threads_do_not_interleave(meta):
    meta.execute("INSERT INTO t VALUES ('n', 0)")

    def bump() -> None:
        for _ in range(200):
            with meta.transaction():
                value = meta.execute("SELECT v FROM t WHERE k = 'n'")[0]["v"]
                meta.execute("UPDATE t SET v = ? WHERE k = 'n'", (value + 1,))

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert meta.execute("SELECT v FROM t WHERE k = 'n'")[0]["v"] == 800

"""Producer-id dedup: within an append, across appends, window expiry, reopen, truncation."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

from npstream.broker.storage import AckMode, StreamConfig
from npstream.broker.storage.batch_builder import producer_id_mask
from npstream.broker.storage.dedup import find_intra_duplicates

WINDOW = StreamConfig(max_age_ms=0, max_bytes=0, dedup_window_ms=10_000,
                      max_message_bytes=1 << 20)


def test_append_repeated_ids_in_one_append_first_wins(make_storage, table_of):
    log = make_storage().open_log("intra", WINDOW)
    result = log.append(table_of([b"a", b"b", b"c", b"d", b"e"],
                                 ids=["x", "y", "x", None, "y"]))
    assert (result.first_offset, result.stored_count) == (0, 3)
    assert result.duplicates == [(2, 0), (4, 1)]
    table = log.read_table(0, 3)
    assert table.column("value").to_pylist() == [b"a", b"b", b"d"]
    assert table.column("id").to_pylist()[:2] == ["x", "y"]


def test_append_id_seen_in_window_not_stored_reports_original(make_storage, table_of, clock):
    log = make_storage().open_log("cross", WINDOW)
    log.append(table_of([b"a", b"b"], ids=["p", "q"]))
    clock.advance(9_999)
    result = log.append(table_of([b"q2", b"new", b"p2", b"q3"], ids=["q", "r", "p", "q"]))
    assert (result.first_offset, result.stored_count) == (2, 1)
    assert result.duplicates == [(0, 1), (2, 0), (3, 1)]
    assert log.read_table(2, 3).column("value").to_pylist() == [b"new"]


def test_append_after_window_expires_stores_id_again(make_storage, table_of, clock):
    log = make_storage().open_log("expiry", WINDOW)
    log.append(table_of([b"first"], ids=["k"]))
    clock.advance(10_000)  # stored exactly dedup_window_ms ago: expired
    result = log.append(table_of([b"second"], ids=["k"]))
    assert (result.first_offset, result.stored_count, result.duplicates) == (1, 1, [])
    clock.advance(9_999)
    assert log.append(table_of([b"third"], ids=["k"])).duplicates == [(0, 1)]


def test_dedup_window_survives_reopen(make_storage, table_of, clock):
    storage = make_storage(segment_bytes=1200)
    log = storage.open_log("reopen", WINDOW)
    for index in range(12):
        log.append(table_of([f"v{index}".encode()], ids=[f"id{index}"]))
        log.append(table_of([b"anonymous"]))  # no producer id: frame not flagged
        clock.advance(1_000)
    storage.close()
    # id0..id2 were stored >= 10 s ago by now; id3..id11 are inside the window.
    log = make_storage(segment_bytes=1200).open_log("reopen", WINDOW)
    result = log.append(table_of([b"x"] * 12, ids=[f"id{i}" for i in range(12)]))
    assert result.stored_count == 3
    assert result.duplicates == [(i, 2 * i) for i in range(3, 12)]


def test_dedup_after_truncate_and_delete_forgets_removed_ids(make_storage, table_of, clock):
    log = make_storage().open_log("forget", WINDOW)
    log.append(table_of([b"a", b"b", b"c"], ids=["a", "b", "c"]))
    log.append(table_of([b"d"], ids=["d"]))
    log.append(table_of([b"e"], ids=["e"]))
    log.truncate_to(4)  # drops e
    assert log.append(table_of([b"e"], ids=["e"])).stored_count == 1
    log.delete_before(2)  # drops a, b
    result = log.append(table_of([b"a", b"c", b"d"], ids=["a", "c", "d"]))
    assert result.stored_count == 1 and result.duplicates == [(1, 2), (2, 3)]


def test_dedup_concurrent_appends_of_same_id_store_it_once(make_storage, table_of):
    log = make_storage().open_log("race", WINDOW)
    results = []
    barrier = threading.Barrier(8)

    def publish(index: int) -> None:
        barrier.wait()
        results.append(log.append(table_of([f"w{index}".encode()], ids=["same"]),
                                  ack=AckMode.WRITE))

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert log.end_offset == 1
    assert sorted(r.stored_count for r in results) == [0] * 7 + [1]
    assert all(r.duplicates == [(0, 0)] for r in results if r.stored_count == 0)


def test_find_intra_duplicates_large_table_matches_python_reference():
    rng = np.random.default_rng(7)
    values = rng.integers(0, 3000, size=20_000)
    ids = pa.array([None if v % 17 == 0 else ("" if v % 29 == 0 else f"id{v}") for v in values])
    found = find_intra_duplicates(ids, producer_id_mask(ids))
    first_row: dict[str, int] = {}
    expected_rows, expected_firsts = [], []
    for row, value in enumerate(ids.to_pylist()):
        if not value:
            continue
        if value in first_row:
            expected_rows.append(row)
            expected_firsts.append(first_row[value])
        else:
            first_row[value] = row
    assert found is not None
    assert found.rows.tolist() == expected_rows
    assert found.first_rows.tolist() == expected_firsts
    assert find_intra_duplicates(pa.array(["a", "b", None]),
                                 producer_id_mask(pa.array(["a", "b", None]))) is None

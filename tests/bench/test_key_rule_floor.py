"""The trivial server's key rule (bench/transport_floor.py), which bounds ordering=key's goal.

The groups benchmark judges the ordering=key goal beside the least the key rule
costs, measured in a trivial server. That bound is only honest if the trivial
server applies the whole rule and hands out every row: these tests check it
does, so a floor that skipped work would fail here, not flatter the bound.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import pyarrow as pa
import pytest

from harness import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))

import bench_common
import group_batches
import transport_floor


def _filled(n: int, keys: int) -> transport_floor._KeyedRows:
    rows = transport_floor._KeyedRows()
    rows.fill(transport_floor._FILL_KEYED_REQUEST.pack(n, 16, keys, True), None)
    return rows


def _fetch(rows: transport_floor._KeyedRows, limit: int, keyed: bool) -> pa.Table:
    reply = rows.fetch_rows(transport_floor._FETCH_ROWS_REQUEST.pack(limit, keyed), None)
    return pa.ipc.open_stream(reply).read_all()


def test_the_key_rule_hands_out_every_row_once_and_each_keys_rows_in_offset_order() -> None:
    rows = _filled(25_000, 300)  # batches of 1,000 out of 300 keys: most keys repeat
    calls: list[pa.Table] = []
    while True:
        batch = _fetch(rows, 1000, keyed=True)
        if not batch.num_rows:
            break
        calls.append(batch)
    offsets = [o for batch in calls for o in batch.column("offset").to_pylist()]
    assert sorted(offsets) == list(range(25_000))
    by_key: dict[bytes, list[int]] = defaultdict(list)
    for batch in calls:
        keys = batch.column("key").to_pylist()
        assert len(set(keys)) == len(keys)  # never two of one key in a call
        assert batch.num_rows <= 1000
        for key, offset in zip(keys, batch.column("offset").to_pylist(), strict=True):
            by_key[key].append(offset)
    assert all(seen == sorted(seen) for seen in by_key.values())
    # The stored keys are those of our bench stream (bench_common.bench_keys).
    stored = {o: k for batch in calls for o, k in zip(batch.column("offset").to_pylist(),
                                                       batch.column("key").to_pylist(),
                                                       strict=True)}
    assert [stored[o] for o in range(5)] == bench_common.bench_keys(5, 300, True)


def test_without_the_rule_rows_come_in_offset_order_and_a_rewind_starts_again() -> None:
    rows = _filled(2_500, 10)
    first = _fetch(rows, 1000, keyed=False)
    assert first.column("offset").to_pylist() == list(range(1000))
    assert first.schema.names == ["offset", "id", "key", "value", "timestamp", "headers"]
    assert _fetch(rows, 2000, keyed=False).column("offset").to_pylist() == list(
        range(1000, 2500))
    assert _fetch(rows, 1000, keyed=False).num_rows == 0
    assert rows.fetch_rows(transport_floor._FETCH_ROWS_REQUEST.pack(0, 0), None) == b""  # rewind
    assert _fetch(rows, 3, keyed=False).column("offset").to_pylist() == [0, 1, 2]


def test_the_ceiling_adds_the_rules_cost_to_our_unordered_time() -> None:
    floor = [{"msgs_per_s": 1_600_000.0}, {"msgs_per_s": 1_000_000.0}]
    assert group_batches._rule_cost_us(floor) == pytest.approx(375.0)  # 1,000 - 625 us
    # Ours unordered at 1,000,000 msg/s: 1,000 us per 1,000, so at most 1,000 / 1,375.
    assert group_batches._rule_ceiling({"msgs_per_s": 1_000_000.0}, floor) == pytest.approx(
        1000 / 1375)
    assert group_batches._rule_ceiling({"msgs_per_s": 1_000_000.0}, None) is None
    assert group_batches._rule_ceiling({"msgs_per_s": 1.0}, [{}, {"msgs_per_s": 1.0}]) is None

"""Unit tests of the key-order planner (groups/key_order.py): plans, finishes, drops.

No broker: KeyOrder is fed parts (Arrow batches or lists of rows, as the log
hands them out) and finished ranges, and its decisions are checked exactly and
against RowByRow, the rule one row at a time.
"""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from npstream.broker.groups.key_order import KeyOrder
from npstream.broker.groups.leases import DeliveryRow
from npstream.broker.groups.tuning import KEY_ORDER_SINGLES_UP_TO, KEY_ORDER_SLICES_UP_TO


def batch(keys: list[bytes | None]) -> pa.RecordBatch:
    return pa.record_batch({"key": pa.array(keys, pa.binary())})


def keys_of(parts: list) -> list[bytes | None]:
    """The keys of planned rows: Arrow parts or lists of rows."""
    return [k for part in parts for k in (
        [row.key for row in part] if isinstance(part, list) else part.column("key").to_pylist())]


def test_plan_delivers_the_first_of_each_key_and_holds_the_rest():
    order = KeyOrder()
    plan = order.plan(10, [batch([b"a", b"b", b"a", None, b"c", b"b"])])
    assert plan.runs == [(True, 2), (False, 1), (True, 2), (False, 1)]
    assert keys_of(plan.rows) == [b"a", b"b", None, b"c"]
    assert len(plan.rows) == 2  # a few holes: a slice per run
    assert order.held == 2
    # a: 10 busy, 12 held; b: 11 busy, 15 held; c: 14 busy; 13 has no key
    assert order.finished([(10, 11)], []) == [12]
    assert order.finished([(12, 13)], []) == []
    assert order.finished([(11, 16)], [(14, 15)]) == [15]
    assert order.held == 0


def test_a_part_with_many_holes_is_delivered_as_one_filtered_part():
    order = KeyOrder()
    keys = [b"k%d" % (i // 2) for i in range(2 * (KEY_ORDER_SLICES_UP_TO + 1))]  # aabbcc...
    plan = order.plan(0, [batch(keys)])
    assert plan.runs == [(True, 1), (False, 1)] * (KEY_ORDER_SLICES_UP_TO + 1)
    assert len(plan.rows) == 1 and keys_of(plan.rows) == keys[::2]


def test_a_part_of_distinct_free_keys_is_delivered_whole_keyless_rows_included():
    order = KeyOrder()
    part = batch([b"a", None, b"b"])
    plan = order.plan(0, [part])
    assert plan.runs == [(True, 3)] and plan.rows[0] is part  # the part itself, not a copy
    plan = order.plan(3, [batch([b"b", None, b"c"])])  # b is busy at 2
    assert plan.runs == [(False, 1), (True, 2)] and keys_of(plan.rows) == [None, b"c"]
    assert order.finished([(0, 3)], []) == [3]  # a and b free; b's held 3 is busy now
    assert order.finished([(3, 6)], []) == []
    assert order.held == 0 and order.busy == 0 and not order._blocks


def test_plan_across_parts_and_a_busy_key_from_an_earlier_plan():
    order = KeyOrder()
    order.plan(0, [batch([b"a"])])
    plan = order.plan(1, [batch([b"a", b"b"]), [], batch([b"b", None])])
    assert plan.runs == [(False, 1), (True, 1), (False, 1), (True, 1)]
    assert keys_of(plan.rows) == [b"b", None]


def test_drop_below_releases_the_first_held_offset_still_in_the_log():
    order = KeyOrder()
    order.plan(0, [batch([b"a", b"a", b"a", b"a"])])
    assert order.drop_below(2) == [2]
    assert order.finished([(2, 3)], []) == [3]


class RowByRow:
    """The rule of ordering by key, one row at a time: what KeyOrder computes in bulk."""

    def __init__(self) -> None:
        self.busy: dict[bytes, int] = {}
        self.held: dict[bytes, list[int]] = {}

    def plan(self, first: int, keys: list[bytes | None]) -> list[bool]:
        out = []
        for i, key in enumerate(keys):
            if key is not None and key in self.busy:
                self.held.setdefault(key, []).append(first + i)
                out.append(False)
                continue
            if key is not None:
                self.busy[key] = first + i
            out.append(True)
        return out

    def finished(self, ranges: list[tuple[int, int]], unfinished: list[tuple[int, int]],
                 lo_bound: int | None = None) -> list[int]:
        def inside(o: int, runs: list[tuple[int, int]]) -> bool:
            return any(a <= o < b for a, b in runs)
        released = []
        for key, offset in list(self.busy.items()):
            if not inside(offset, ranges) or inside(offset, unfinished):
                continue
            del self.busy[key]
            queue = self.held.get(key, [])
            while queue:
                following = queue.pop(0)
                if lo_bound is None or following >= lo_bound:
                    self.busy[key] = following
                    released.append(following)
                    break
            if not queue:
                self.held.pop(key, None)
        return sorted(released)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_key_order_decides_as_the_row_by_row_rule(data):
    """Random plans (repeats, busy keys, keyless rows, list parts) and random finishes,
    partial ones and unfinished runs included, against RowByRow."""
    order, model = KeyOrder(), RowByRow()
    next_offset = 0
    keys = st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"]))
    for _step in range(data.draw(st.integers(1, 12))):
        action = data.draw(st.sampled_from(["plan", "plan", "finish", "drop"]))
        if action == "plan":
            sizes = data.draw(st.lists(st.integers(0, 8), min_size=1, max_size=3))
            parts, all_keys = [], []
            for size in sizes:
                part_keys = data.draw(st.lists(keys, min_size=size, max_size=size))
                as_rows = data.draw(st.booleans())  # a lone message the log kept as values
                parts.append([DeliveryRow(0, "", k, b"", {}, 0) for k in part_keys] if as_rows
                             else batch(part_keys))
                all_keys += part_keys
            plan = order.plan(next_offset, parts)
            got = [deliver for deliver, count in plan.runs for _ in range(count)]
            assert got == model.plan(next_offset, all_keys)
            assert keys_of(plan.rows) == [k for k, d in zip(all_keys, got, strict=True) if d]
            next_offset += len(all_keys)
        elif action == "finish" and next_offset:
            lo = data.draw(st.integers(0, next_offset - 1))
            hi = data.draw(st.integers(lo + 1, next_offset))
            cut = data.draw(st.integers(lo, hi))
            ranges = [(lo, cut), (cut, hi)] if data.draw(st.booleans()) else [(lo, hi)]
            unfinished = [(cut, cut + 1)] if data.draw(st.booleans()) else []
            assert order.finished(ranges, unfinished) == model.finished(ranges, unfinished)
        elif action == "drop" and next_offset:
            start = data.draw(st.integers(0, next_offset))
            assert order.drop_below(start) == model.finished([(-1, start)], [], start)
            for key in list(model.held):
                model.held[key] = [o for o in model.held[key] if o >= start]
                if not model.held[key]:
                    del model.held[key]
        assert order.held == sum(len(q) for q in model.held.values())
        assert order.busy == len(model.busy)


def rows(keys: list[bytes | None]) -> list[DeliveryRow]:
    """A part as the log keeps recent rows: Python values, not a batch."""
    return [DeliveryRow(0, "", k, b"", {}, 0) for k in keys]


def test_plan_a_small_part_keeps_its_keys_busy_per_offset_until_each_finishes():
    order = KeyOrder()
    keys = [b"k%d" % i for i in range(KEY_ORDER_SINGLES_UP_TO)]
    assert order.plan(0, [batch(keys)]).runs == [(True, len(keys))]
    assert order.busy == len(keys) and not order._blocks  # no block for a few rows
    plan = order.plan(len(keys), [batch([b"k0", b"k1"])])
    assert plan.runs == [(False, 2)] and plan.rows == []
    assert order.finished([(1, 2)], []) == [len(keys) + 1]  # k1 free: its held offset next
    assert order.finished([(0, 1)], []) == [len(keys)]
    assert order.held == 0 and order.busy == len(keys)


def test_plan_a_hot_key_releases_its_held_offsets_one_at_a_time_in_offset_order():
    order = KeyOrder()
    plan = order.plan(100, [batch([b"hot"] * 1000)])
    assert plan.runs == [(True, 1), (False, 999)] and keys_of(plan.rows) == [b"hot"]
    for offset in range(100, 1099):
        assert order.finished([(offset, offset + 1)], []) == [offset + 1]
    assert order.held == 0
    assert order.finished([(1099, 1100)], []) == []
    assert order.busy == 0


def test_plan_repeated_keys_and_keyless_rows_hold_only_the_repeats():
    order = KeyOrder()
    plan = order.plan(0, [batch([b"a", None, b"a", None, b"b", b"b"])])
    assert plan.runs == [(True, 2), (False, 1), (True, 2), (False, 1)]
    assert keys_of(plan.rows) == [b"a", None, None, b"b"]
    assert (order.held, order.busy) == (2, 2)


def test_plan_a_list_part_with_many_holes_is_filtered_into_one_list():
    order = KeyOrder()
    keys = [b"k%d" % (i // 2) for i in range(2 * (KEY_ORDER_SLICES_UP_TO + 1))]
    plan = order.plan(0, [rows(keys)])
    assert plan.runs == [(True, 1), (False, 1)] * (KEY_ORDER_SLICES_UP_TO + 1)
    assert len(plan.rows) == 1 and isinstance(plan.rows[0], list)
    assert keys_of(plan.rows) == keys[::2]


def test_finished_with_an_unfinished_run_keeps_that_key_busy():
    order = KeyOrder()
    order.plan(0, [batch([b"a", b"b", b"a", b"b"])])
    # 0 acked while it is being dead-lettered: not finished, a stays busy
    assert order.finished([(0, 2)], [(0, 1)]) == [3]
    assert order.held == 1
    assert order.finished([(0, 1)], []) == [2]
    assert order.held == 0


def test_finished_of_merged_runs_decides_as_of_the_same_ranges_unmerged():
    def finish(merged: bool) -> list[int]:
        order = KeyOrder()
        order.plan(0, [batch([b"a", b"b", b"c", b"a", b"b", b"c"])])
        ranges = [(0, 1), (2, 3)] if merged else [(2, 3), (0, 1), (0, 1)]
        return order.finished(ranges, [], merged=merged)

    assert finish(True) == finish(False) == [3, 5]


def test_drop_below_skips_held_offsets_that_left_the_log_too():
    order = KeyOrder()
    order.plan(0, [batch([b"a", b"a", b"a", b"a", b"b", b"b"])])
    assert order.drop_below(3) == [3]  # a's 1 and 2 left the log with 0: 3 is next
    assert order.finished([(3, 4)], []) == []
    assert (order.held, order.busy) == (1, 1)  # b: 4 busy, 5 held
    assert order.finished([(4, 5)], []) == [5]


def test_clear_forgets_busy_keys_and_held_offsets():
    order = KeyOrder()
    order.plan(0, [batch([b"a", b"a", b"b"])])
    order.clear()
    assert (order.held, order.busy) == (0, 0)
    assert order.plan(3, [batch([b"a", b"b"])]).runs == [(True, 2)]
    assert order.finished([(0, 3)], []) == []  # offsets of before the clear: nothing

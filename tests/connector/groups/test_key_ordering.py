"""Shared groups ordered by key (ordering="key"), on a real broker and in the bookkeeping."""

from __future__ import annotations

import random
import threading
import time

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from npstream import Client
from npstream.broker.groups.key_order import KeyOrder
from npstream.broker.groups.leases import HELD, LEASED, WAITING, DeliveryRow, LeaseTable
from npstream.broker.groups.shared_config import SharedConfig
from npstream.broker.groups.tuning import KEY_ORDER_SLICES_UP_TO
from npstream.errors import GroupNotFound


def publish_keyed(client: Client, stream: str, keys: list[str | None]) -> None:
    client.create_stream(stream, exist_ok=True)
    client.publish_batch(stream, [{"value": f"v{i}", **({"key": k} if k else {})}
                                  for i, k in enumerate(keys)])


# ---------------------------------------------------------------- bookkeeping


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


def test_held_spans_are_unfinished_and_leased_one_at_a_time_when_their_turn_comes():
    t = LeaseTable(0, SharedConfig(dead_letter_stream="s.dlq", ordering="key"))
    t.lease_fresh("m", 0, 1, 0, 100)
    t.hold_fresh(1, 3)
    assert (t.committed, t.unfinished, t.in_flight) == (0, 4, 1)
    assert t.ack([1], "m", 5) == 0  # a held message was never delivered: no ack for it
    (leased,) = t.lease_held("m2", [2], 10, 100)
    assert (leased.start, leased.end, leased.attempt, leased.expires_ms) == (2, 3, 1, 110)
    assert t.lease_held("m2", [2, 9], 10, 100) == []  # leased already; never read
    assert [(s.start, s.end, s.state) for s in t.spans()] == [
        (0, 1, LEASED), (1, 2, HELD), (2, 3, LEASED), (3, 4, HELD)]
    assert (t.in_flight, t.members["m2"].in_flight) == (2, 1)
    assert t.expire(110) == [] and t.span_at(2).state == WAITING  # expires as any lease
    assert t.release_all_held(20) == 2


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


# ---------------------------------------------------------------- on a broker


def test_a_key_is_never_delivered_twice_at_once_and_keyless_messages_are_free(
        client, stream_name):
    publish_keyed(client, stream_name, ["a", "a", None, "b", None, "a", "b"])
    first = client.receive_batch(stream_name, "g", max=10, ordering="key")
    assert first.offsets.tolist() == [0, 2, 3, 4]
    assert client.receive_batch(stream_name, "g", max=10).offsets.tolist() == []
    first.nack([0])  # the nacked one comes back before anything later of its key
    again = client.receive_batch(stream_name, "g", max=10)
    assert again.offsets.tolist() == [0]
    assert again.table.column("attempt").to_pylist() == [2]
    again.ack()
    first.ack([3])
    assert client.receive_batch(stream_name, "g", max=10, wait=2).offsets.tolist() == [1, 6]
    info = client.describe_group(stream_name, "g")
    assert info.settings is not None and info.settings.ordering == "key"


def test_four_members_with_nacks_and_expiries_process_each_key_in_offset_order(
        client, stream_name):
    rng = random.Random(16)
    keys = [f"k{rng.randint(0, 24)}" for _ in range(1500)]
    publish_keyed(client, stream_name, keys)
    processed: dict[str, list[int]] = {}
    lock = threading.Lock()
    done = threading.Event()

    def member(index: int) -> None:
        local = random.Random(index)
        with Client(client.address) as own:
            while not done.is_set():
                leases = own.receive(stream_name, "workers", max=20, wait=0.2, ack_wait=0.3,
                                     ordering="key", member_id=f"m{index}")
                for lease in leases:
                    roll = local.random()
                    if roll < 0.1:
                        lease.nack()
                    elif roll < 0.15:
                        continue  # let the lease expire
                    else:
                        with lock:
                            processed.setdefault(lease.key.decode(), []).append(lease.offset)
                        lease.ack()

    threads = [threading.Thread(target=member, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:  # the members' first receive creates the group
            if client.describe_group(stream_name, "workers").committed_offset == len(keys):
                break
        except GroupNotFound:
            pass
        time.sleep(0.1)
    done.set()
    for thread in threads:
        thread.join(30)
    expected: dict[str, list[int]] = {}
    for offset, key in enumerate(keys):
        expected.setdefault(key, []).append(offset)
    assert processed == expected  # every message once, each key in offset order


def test_switching_ordering_off_releases_held_messages(client, stream_name):
    publish_keyed(client, stream_name, ["a", "a", "a"])
    held = client.receive_batch(stream_name, "g", max=10, ordering="key")
    assert held.offsets.tolist() == [0]
    rest = client.receive_batch(stream_name, "g", max=10, ordering="none")
    assert rest.offsets.tolist() == [1, 2]
    assert held.ack() + rest.ack() == 3

"""Unit tests of the pure lease bookkeeping (no broker, explicit times)."""

from __future__ import annotations

import pytest

from npstream.broker.groups.leases import DeliveryRow, LeaseTable
from npstream.broker.groups.shared_config import SharedConfig


def rows(first: int, count: int) -> list[DeliveryRow]:
    return [DeliveryRow(o, f"id-{o}", None, f"v{o}".encode(), {}, 1000 + o)
            for o in range(first, first + count)]


def table(committed: int = 0, **config: object) -> LeaseTable:
    return LeaseTable(committed, SharedConfig(dead_letter_stream="s.dlq", **config))


def check_invariant(t: LeaseTable) -> None:
    """Every offset in [committed, next_fresh) is pending, done or being dead-lettered."""
    for offset in range(t.committed, t.next_fresh):
        places = [offset in t.pending, offset in t.done, offset in t.dead_lettering]
        assert places.count(True) == 1, (offset, places)
    assert all(o >= t.committed for o in t.done)


def test_ack_in_order_advances_committed_to_next_unacked():
    t = table()
    leased = t.lease_fresh("m1", rows(0, 5), now_ms=0, ack_wait_ms=1000)
    assert [e.offset for e in leased] == [0, 1, 2, 3, 4]
    assert [e.attempt for e in leased] == [1] * 5
    assert t.ack([0, 1], "m1", 10) == 2
    assert t.committed == 2
    assert t.in_flight == 3
    check_invariant(t)


def test_ack_out_of_order_waits_for_lowest_then_jumps():
    t = table()
    t.lease_fresh("m1", rows(0, 4), 0, 1000)
    assert t.ack([1, 2, 3], "m1", 10) == 3
    assert t.committed == 0
    assert t.done == {1, 2, 3}
    check_invariant(t)
    assert t.ack([0], "m2", 20) == 1  # any member may ack
    assert t.committed == 4
    assert t.done == set()
    assert t.unfinished == 0
    check_invariant(t)


def test_ack_twice_or_unknown_offset_counts_zero():
    t = table()
    t.lease_fresh("m1", rows(0, 2), 0, 1000)
    assert t.ack([0], "m1", 1) == 1
    assert t.ack([0, 7, -1], "m1", 2) == 0
    assert t.committed == 1


def test_expire_lease_redelivers_to_any_member_with_next_attempt():
    t = table()
    t.lease_fresh("m1", rows(0, 2), now_ms=0, ack_wait_ms=100)
    t.ack([1], "m1", 5)
    assert t.lease_ready("m2", 99, 100, 10) == []
    assert t.expire(99) == []
    assert t.expire(100) == []
    assert t.members["m1"].in_flight == 0
    again = t.lease_ready("m2", 100, 100, 10)
    assert [(e.offset, e.attempt, e.member) for e in again] == [(0, 2, "m2")]
    assert t.members["m2"].in_flight == 1
    check_invariant(t)


def test_late_ack_after_expiry_is_accepted_and_not_redelivered():
    t = table()
    t.lease_fresh("m1", rows(0, 1), 0, 100)
    t.expire(150)
    assert t.ack([0], "m1", 160) == 1
    assert t.lease_ready("m2", 1000, 100, 10) == []
    assert t.committed == 1


def test_nack_without_delay_redelivers_now_and_with_delay_not_before():
    t = table()
    t.lease_fresh("m1", rows(0, 2), 0, 10_000)
    assert t.nack([0], "m1", delay_ms=0, now_ms=50) == (1, [])
    assert t.nack([1], "m1", delay_ms=500, now_ms=50) == (1, [])
    assert [e.offset for e in t.lease_ready("m2", 50, 10_000, 10)] == [0]
    assert t.lease_ready("m2", 549, 10_000, 10) == []
    assert [e.offset for e in t.lease_ready("m2", 550, 10_000, 10)] == [1]
    assert t.next_due_ms() == 50 + 10_000  # the first lease made at 50


def test_nack_by_other_member_is_ignored():
    t = table()
    t.lease_fresh("m1", rows(0, 1), 0, 1000)
    assert t.nack([0], "m2", 0, 10) == (0, [])
    assert t.pending[0].member == "m1"
    assert t.nack([0], None, 0, 10) == (1, [])  # no member given: any holder


def test_backoff_spaces_redeliveries_and_last_value_repeats():
    t = table(backoff_ms=(100, 300))
    t.lease_fresh("m", rows(0, 1), 0, 10_000)
    times = []
    now = 0
    for _ in range(4):
        t.nack([0], "m", 0, now)
        due = t.next_due_ms()
        assert due is not None
        times.append(due - now)
        now = due
        assert [e.offset for e in t.lease_ready("m", now, 10_000, 1)] == [0]
    assert times == [100, 300, 300, 300]
    assert t.pending[0].attempt == 5


def test_backoff_after_expiry_counts_from_lease_end():
    t = table(backoff_ms=(200,))
    t.lease_fresh("m", rows(0, 1), 0, 100)
    t.expire(1000)  # processed late; the lease ended at 100
    assert t.next_due_ms() == 300


def test_explicit_nack_delay_longer_than_backoff_wins():
    t = table(backoff_ms=(100,))
    t.lease_fresh("m", rows(0, 1), 0, 10_000)
    t.nack([0], "m", 1000, 0)
    assert t.next_due_ms() == 1000


def test_max_deliver_exhausted_goes_to_dead_lettering_then_counts_done():
    t = table(max_deliver=2)
    t.lease_fresh("m", rows(0, 2), 0, 100)
    assert t.nack([0], "m", 0, 10) == (1, [])
    t.lease_ready("m", 10, 100, 1)
    count, dead = t.nack([0], "m", 0, 20)
    assert count == 1
    assert [(e.offset, e.attempt, e.failure) for e in dead] == [(0, 2, "nack")]
    assert 0 in t.dead_lettering and 0 not in t.pending
    check_invariant(t)
    assert t.committed == 0  # not done until the copy is stored
    assert t.dead_lettered(0) is True
    assert t.committed == 1
    check_invariant(t)


def test_max_deliver_reached_by_expiry_reports_expired():
    t = table(max_deliver=1)
    t.lease_fresh("m", rows(0, 1), 0, 100)
    dead = t.expire(100)
    assert [(e.offset, e.attempt, e.failure) for e in dead] == [(0, 1, "expired")]


def test_dead_letter_failure_redelivers_later():
    t = table(max_deliver=1)
    t.lease_fresh("m", rows(0, 1), 0, 100)
    t.expire(100)
    t.dead_letter_failed(0, retry_at_ms=5000)
    assert t.lease_ready("m", 4999, 100, 1) == []
    again = t.lease_ready("m", 5000, 100, 1)
    assert [(e.offset, e.attempt) for e in again] == [(0, 2)]
    assert [e.offset for e in t.expire(5100)] == [0]  # exhausted again: dead-letter again


def test_drop_below_forgets_leases_done_and_moves_committed():
    t = table()
    t.lease_fresh("m", rows(0, 6), 0, 100)
    t.ack([2, 5], "m", 1)
    assert t.drop_below(3) == 2  # offsets 0 and 1 were pending; 2 was done
    assert t.committed == 3
    assert sorted(t.pending) == [3, 4]
    assert t.done == {5}
    assert t.in_flight == 2
    assert t.expire(1000) == []
    assert [e.offset for e in t.lease_ready("m", 1000, 100, 10)] == [3, 4]  # nothing below 3
    check_invariant(t)


def test_drop_below_past_everything_leaves_nothing_pending():
    t = table()
    t.lease_fresh("m", rows(0, 3), 0, 100)
    t.drop_below(10)
    assert (t.committed, t.next_fresh, t.unfinished, t.in_flight) == (10, 10, 0, 0)
    assert t.next_due_ms() is None


def test_reset_drops_everything_and_restarts_at_offset():
    t = table()
    t.lease_fresh("m", rows(0, 3), 0, 100)
    t.nack([1], "m", 0, 1)
    assert t.reset(1) == 3
    assert (t.committed, t.next_fresh, t.unfinished, t.in_flight) == (1, 1, 0, 0)
    assert t.lease_ready("m", 10_000, 100, 10) == []


def test_fresh_budget_stops_at_pending_and_window_limits():
    t = table()
    t.lease_fresh("m", rows(0, 3), 0, 100)
    assert t.fresh_budget(max_pending=5, max_window=100) == 2
    t.ack([1, 2], "m", 1)
    assert t.fresh_budget(max_pending=5, max_window=4) == 1  # window: 3 - 0 used of 4
    t.ack([0], "m", 2)
    assert t.fresh_budget(max_pending=5, max_window=4) == 4


def test_lease_fresh_below_next_fresh_is_refused():
    t = table(committed=5)
    with pytest.raises(ValueError, match="below next_fresh 5"):
        t.lease_fresh("m", rows(3, 1), 0, 100)


def test_idle_member_forgotten_only_without_leases_or_connection():
    t = table()
    t.lease_fresh("busy", rows(0, 1), 0, 100_000)
    t.touch("idle", 0)
    t.touch("connected", 0).connections = 1
    assert t.forget_idle_members(60_000, 60_000) == ["idle"]
    assert sorted(t.members) == ["busy", "connected"]

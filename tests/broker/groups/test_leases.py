"""Unit tests of the pure lease bookkeeping as offset spans (no broker, explicit times)."""

from __future__ import annotations

import random

from npstream.broker.groups.leases import (
    DEAD_LETTERING,
    HELD,
    LEASED,
    WAITING,
    LeaseTable,
    Span,
    finish_runs,
    offset_runs,
)
from npstream.broker.groups.shared_config import SharedConfig


def table(committed: int = 0, **config: object) -> LeaseTable:
    return LeaseTable(committed, SharedConfig(dead_letter_stream="s.dlq", **config))


def spans(t: LeaseTable) -> list[tuple[int, int, str, int, str | None]]:
    return [(s.start, s.end, s.state, s.attempt, s.member) for s in t.spans()]


def offsets(leased: list[Span]) -> list[int]:
    return [o for s in leased for o in range(s.start, s.end)]


def check_invariant(t: LeaseTable) -> None:
    """Spans are disjoint, ordered, inside [committed, next_fresh); counts agree."""
    previous_end = t.committed
    total = 0
    for span in t.spans():
        assert span.start >= previous_end and span.end > span.start
        previous_end = span.end
        total += span.count
    assert previous_end <= t.next_fresh
    assert total == t.unfinished
    leased = sum(s.count for s in t.spans() if s.state == LEASED)
    assert leased == t.in_flight


def test_offset_runs_merge_sorted_and_drop_duplicates():
    assert offset_runs([5, 1, 2, 2, 3, 9]) == [(1, 4), (5, 6), (9, 10)]


def test_finish_runs_merges_offsets_and_ranges_into_one_sorted_list():
    assert finish_runs([9, 3, 3, 4]) == [(3, 5), (9, 10)]
    assert finish_runs([], [(20, 30), (5, 8), (7, 10), (12, 12)]) == [(5, 10), (20, 30)]
    assert finish_runs([10, 4, 30], [(5, 8), (20, 30)]) == [(4, 8), (10, 11), (20, 31)]
    assert finish_runs([]) == []


def test_a_fresh_batch_is_one_span_and_an_ack_of_its_range_finishes_it():
    t = table()
    (span,) = t.take_fresh("m1", [(True, 1000)], 0, 1000)
    assert (span.start, span.end, span.attempt) == (0, 1000, 1)
    assert spans(t) == [(0, 1000, LEASED, 1, "m1")]
    assert t.in_flight == 1000
    assert t.ack_runs(finish_runs([], [(0, 1000)]), "m1", 5) == 1000
    assert (t.committed, t.unfinished, t.in_flight) == (1000, 0, 0)
    assert t.next_due_ms() is None


def test_ack_in_order_advances_committed_to_next_unacked():
    t = table()
    t.take_fresh("m1", [(True, 5)], 0, 1000)
    assert t.ack_runs(finish_runs([0, 1]), "m1", 10) == 2
    assert t.committed == 2
    assert t.in_flight == 3
    check_invariant(t)


def test_ack_out_of_order_waits_for_lowest_then_jumps():
    t = table()
    t.take_fresh("m1", [(True, 4)], 0, 1000)
    assert t.ack_runs(finish_runs([1, 2, 3]), "m1", 10) == 3
    assert t.committed == 0
    assert spans(t) == [(0, 1, LEASED, 1, "m1")]
    check_invariant(t)
    assert t.ack_runs(finish_runs([0]), "m2", 20) == 1  # any member may ack
    assert (t.committed, t.unfinished) == (4, 0)
    check_invariant(t)


def test_partial_acks_split_a_span_and_keep_the_rest_leased_until_expiry():
    t = table()
    t.take_fresh("m1", [(True, 10)], 0, 100)
    assert t.ack_runs(finish_runs([2, 3, 7]), "m1", 1) == 3
    assert spans(t) == [(0, 2, LEASED, 1, "m1"), (4, 7, LEASED, 1, "m1"),
                        (8, 10, LEASED, 1, "m1")]
    check_invariant(t)
    assert t.expire(100) == []
    assert [(s.start, s.end, s.state) for s in t.spans()] == [
        (0, 2, WAITING), (4, 7, WAITING), (8, 10, WAITING)]
    again = t.lease_ready("m2", 100, 100, 100)
    assert offsets(again) == [0, 1, 4, 5, 6, 8, 9]
    assert {s.attempt for s in again} == {2}
    check_invariant(t)


def test_ack_twice_or_unknown_offset_counts_zero():
    t = table()
    t.take_fresh("m1", [(True, 2)], 0, 1000)
    assert t.ack_runs(finish_runs([0]), "m1", 1) == 1
    assert t.ack_runs(finish_runs([0, 7, -1]), "m1", 2) == 0
    assert t.ack_runs(finish_runs([], [(0, 1), (5, 9)]), "m1", 2) == 0
    assert t.committed == 1


def test_expire_lease_redelivers_to_any_member_with_next_attempt():
    t = table()
    t.take_fresh("m1", [(True, 2)], 0, 100)
    t.ack_runs(finish_runs([1]), "m1", 5)
    assert t.lease_ready("m2", 99, 100, 10) == []
    assert t.expire(99) == []
    assert t.expire(100) == []
    assert t.members["m1"].in_flight == 0
    again = t.lease_ready("m2", 100, 100, 10)
    assert [(s.start, s.end, s.attempt, s.member) for s in again] == [(0, 1, 2, "m2")]
    assert t.members["m2"].in_flight == 1
    check_invariant(t)


def test_lease_ready_splits_a_waiting_span_at_the_limit():
    t = table()
    t.take_fresh("m1", [(True, 10)], 0, 100)
    t.expire(100)
    first = t.lease_ready("m2", 100, 100, 4)
    assert [(s.start, s.end) for s in first] == [(0, 4)]
    rest = t.lease_ready("m3", 100, 100, 100)
    assert [(s.start, s.end, s.member) for s in rest] == [(4, 10, "m3")]
    check_invariant(t)


def test_late_ack_after_expiry_is_accepted_and_not_redelivered():
    t = table()
    t.take_fresh("m1", [(True, 1)], 0, 100)
    t.expire(150)
    assert t.ack_runs(finish_runs([0]), "m1", 160) == 1
    assert t.lease_ready("m2", 1000, 100, 10) == []
    assert t.committed == 1


def test_nack_without_delay_redelivers_now_and_with_delay_not_before():
    t = table()
    t.take_fresh("m1", [(True, 2)], 0, 10_000)
    assert t.nack_runs(finish_runs([0]), "m1", delay_ms=0, now_ms=50) == (1, [])
    assert t.nack_runs(finish_runs([1]), "m1", delay_ms=500, now_ms=50) == (1, [])
    assert offsets(t.lease_ready("m2", 50, 10_000, 10)) == [0]
    assert t.lease_ready("m2", 549, 10_000, 10) == []
    assert offsets(t.lease_ready("m2", 550, 10_000, 10)) == [1]
    assert t.next_due_ms() == 50 + 10_000  # the first lease made at 50


def test_nack_of_a_range_releases_only_that_part():
    t = table()
    t.take_fresh("m1", [(True, 100)], 0, 10_000)
    assert t.nack_runs(finish_runs([], [(10, 20)]), "m1", 0, 5) == (10, [])
    assert [(s.start, s.end, s.state) for s in t.spans()] == [
        (0, 10, LEASED), (10, 20, WAITING), (20, 100, LEASED)]
    assert t.in_flight == 90
    check_invariant(t)


def test_nack_by_other_member_is_ignored():
    t = table()
    t.take_fresh("m1", [(True, 1)], 0, 1000)
    assert t.nack_runs(finish_runs([0]), "m2", 0, 10) == (0, [])
    assert t.span_at(0) is not None and t.span_at(0).member == "m1"
    assert t.nack_runs(finish_runs([0]), None, 0, 10) == (1, [])  # no member given: any holder


def test_backoff_spaces_redeliveries_and_last_value_repeats():
    t = table(backoff_ms=(100, 300))
    t.take_fresh("m", [(True, 1)], 0, 10_000)
    times = []
    now = 0
    for _ in range(4):
        t.nack_runs(finish_runs([0]), "m", 0, now)
        due = t.next_due_ms()
        assert due is not None
        times.append(due - now)
        now = due
        assert offsets(t.lease_ready("m", now, 10_000, 1)) == [0]
    assert times == [100, 300, 300, 300]
    assert t.span_at(0).attempt == 5


def test_backoff_after_expiry_counts_from_lease_end():
    t = table(backoff_ms=(200,))
    t.take_fresh("m", [(True, 1)], 0, 100)
    t.expire(1000)  # processed late; the lease ended at 100
    assert t.next_due_ms() == 300


def test_explicit_nack_delay_longer_than_backoff_wins():
    t = table(backoff_ms=(100,))
    t.take_fresh("m", [(True, 1)], 0, 10_000)
    t.nack_runs(finish_runs([0]), "m", 1000, 0)
    assert t.next_due_ms() == 1000


def test_max_deliver_exhausted_goes_to_dead_lettering_then_counts_done():
    t = table(max_deliver=2)
    t.take_fresh("m", [(True, 2)], 0, 100)
    assert t.nack_runs(finish_runs([0]), "m", 0, 10) == (1, [])
    t.lease_ready("m", 10, 100, 1)
    count, dead = t.nack_runs(finish_runs([0]), "m", 0, 20)
    assert count == 1
    assert [(s.start, s.end, s.attempt, s.failure) for s in dead] == [(0, 1, 2, "nack")]
    assert t.span_at(0).state == DEAD_LETTERING
    # being dead-lettered: an ack does not finish it
    assert t.ack_runs(finish_runs([0]), "m", 21) == 0
    check_invariant(t)
    assert t.committed == 0  # not done until the copy is stored
    assert t.dead_lettered(0, 1) == 1
    assert t.committed == 1
    check_invariant(t)


def test_max_deliver_reached_by_expiry_reports_expired():
    t = table(max_deliver=1)
    t.take_fresh("m", [(True, 3)], 0, 100)
    dead = t.expire(100)
    assert [(s.start, s.end, s.attempt, s.failure) for s in dead] == [(0, 3, 1, "expired")]


def test_dead_letter_failure_redelivers_later():
    t = table(max_deliver=1)
    t.take_fresh("m", [(True, 1)], 0, 100)
    t.expire(100)
    t.dead_letter_failed(0, 1, retry_at_ms=5000)
    assert t.lease_ready("m", 4999, 100, 1) == []
    again = t.lease_ready("m", 5000, 100, 1)
    assert [(s.start, s.attempt) for s in again] == [(0, 2)]
    assert [s.start for s in t.expire(5100)] == [0]  # exhausted again: dead-letter again


def test_dead_lettered_by_range_survives_a_span_cut_by_retention():
    t = table(max_deliver=1)
    t.take_fresh("m", [(True, 10)], 0, 100)
    (dead,) = t.expire(100)
    assert t.drop_below(4) == 4  # retention cut the span being dead-lettered
    assert t.dead_lettered(dead.start, dead.end) == 6
    assert (t.committed, t.unfinished) == (10, 0)


def test_drop_below_forgets_leases_and_moves_committed():
    t = table()
    t.take_fresh("m", [(True, 6)], 0, 100)
    t.ack_runs(finish_runs([2, 5]), "m", 1)
    assert t.drop_below(3) == 2  # offsets 0 and 1 were pending; 2 was done
    assert t.committed == 3
    assert [(s.start, s.end) for s in t.spans()] == [(3, 5)]
    assert t.in_flight == 2
    assert t.expire(1000) == []
    assert offsets(t.lease_ready("m", 1000, 100, 10)) == [3, 4]  # nothing below 3
    check_invariant(t)


def test_drop_below_past_everything_leaves_nothing_pending():
    t = table()
    t.take_fresh("m", [(True, 3)], 0, 100)
    t.drop_below(10)
    assert (t.committed, t.next_fresh, t.unfinished, t.in_flight) == (10, 10, 0, 0)
    assert t.next_due_ms() is None


def test_reset_drops_everything_and_restarts_at_offset():
    t = table()
    t.take_fresh("m", [(True, 3)], 0, 100)
    t.nack_runs(finish_runs([1]), "m", 0, 1)
    assert t.reset(1) == 3
    assert (t.committed, t.next_fresh, t.unfinished, t.in_flight) == (1, 1, 0, 0)
    assert t.lease_ready("m", 10_000, 100, 10) == []


def test_fresh_budget_stops_at_pending_and_window_limits():
    t = table()
    t.take_fresh("m", [(True, 3)], 0, 100)
    assert t.fresh_budget(max_pending=5, max_window=100) == 2
    t.ack_runs(finish_runs([1, 2]), "m", 1)
    assert t.fresh_budget(max_pending=5, max_window=4) == 1  # window: 3 - 0 used of 4
    t.ack_runs(finish_runs([0]), "m", 2)
    assert t.fresh_budget(max_pending=5, max_window=4) == 4


def test_take_fresh_leases_and_holds_runs_from_next_fresh_one_span_each():
    t = table(committed=5)
    leased, empty, held, last = t.take_fresh("m", [(True, 2), (False, 0), (False, 3),
                                                   (True, 1)], 0, 100)
    assert empty is None
    assert [(s.start, s.end, s.state) for s in (leased, held, last)] == [
        (5, 7, LEASED), (7, 10, HELD), (10, 11, LEASED)]
    assert (t.next_fresh, t.unfinished, t.in_flight) == (11, 6, 3)
    assert t.ack_runs(finish_runs([7, 8, 9]), "m", 1) == 0  # held: never acked
    check_invariant(t)


def test_idle_member_forgotten_only_without_leases_or_connection():
    t = table()
    t.take_fresh("busy", [(True, 1)], 0, 100_000)
    t.touch("idle", 0)
    t.touch("connected", 0).connections = 1
    assert t.forget_idle_members(60_000, 60_000) == ["idle"]
    assert sorted(t.members) == ["busy", "connected"]


def test_random_operations_keep_the_invariant_and_never_lose_an_offset():
    """Random leases, partial acks, nacks and expiries: every offset ends acked exactly once."""
    rng = random.Random(7)
    t = table(max_deliver=0)
    acked: set[int] = set()
    now = 0
    while t.next_fresh < 5000 or t.unfinished:
        now += rng.randint(0, 30)
        t.expire(now)
        if t.next_fresh < 5000 and rng.random() < 0.5:
            count = min(rng.randint(1, 200), 5000 - t.next_fresh)
            t.take_fresh(f"m{rng.randint(1, 3)}", [(True, count)], now, 100)
        for span in t.lease_ready(f"m{rng.randint(1, 3)}", now, 100, rng.randint(1, 300)):
            assert span.attempt >= 2
        live = [s for s in t.spans() if s.state == LEASED]
        if live:
            span = rng.choice(live)
            lo = rng.randint(span.start, span.end - 1)
            hi = rng.randint(lo + 1, span.end)
            if rng.random() < 0.8:
                done = t.ack_runs(finish_runs([], [(lo, hi)]), span.member, now)
                assert done == hi - lo
                assert not acked & set(range(lo, hi))
                acked.update(range(lo, hi))
            else:
                t.nack_runs(finish_runs([], [(lo, hi)]), span.member, rng.randint(0, 50), now)
        check_invariant(t)
    assert acked == set(range(5000)) and t.committed == 5000


def test_held_spans_are_unfinished_and_leased_one_at_a_time_when_their_turn_comes():
    t = table(ordering="key")
    t.take_fresh("m", [(True, 1), (False, 3)], 0, 100)
    assert (t.committed, t.unfinished, t.in_flight) == (0, 4, 1)
    # a held message was never delivered: no ack for it
    assert t.ack_runs(finish_runs([1]), "m", 5) == 0
    (leased,) = t.lease_held("m2", [2], 10, 100)
    assert (leased.start, leased.end, leased.attempt, leased.expires_ms) == (2, 3, 1, 110)
    assert t.lease_held("m2", [2, 9], 10, 100) == []  # leased already; never read
    assert [(s.start, s.end, s.state) for s in t.spans()] == [
        (0, 1, LEASED), (1, 2, HELD), (2, 3, LEASED), (3, 4, HELD)]
    assert (t.in_flight, t.members["m2"].in_flight) == (2, 1)
    assert t.expire(110) == [] and t.span_at(2).state == WAITING  # expires as any lease
    assert t.release_all_held(20) == 2

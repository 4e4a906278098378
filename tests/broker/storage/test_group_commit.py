"""The group commit primitive (storage/group_commit.py): rounds, leaders, the flusher thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from npstream.broker.storage.group_commit import (
    CommitQueue,
    CommitRequest,
    GroupCommit,
    GroupCommitClosedError,
)


class Gate:
    """A flush that records its batches and can be held until released."""

    def __init__(self, fail_when: Callable[[list[int]], bool] = lambda _batch: False) -> None:
        self.batches: list[list[int]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.fail_when = fail_when

    def hold(self) -> None:
        self.release.clear()
        self.entered.clear()

    def __call__(self, batch: list[int]) -> None:
        self.batches.append(list(batch))
        self.entered.set()
        assert self.release.wait(10)
        if self.fail_when(batch):
            raise OSError(28, f"flush of {batch} failed")


def commits(gate: Gate, **options: object) -> GroupCommit[int, list[int]]:
    return GroupCommit(gate, list, list.append, **options)  # type: ignore[arg-type]


def held_in_a_flush(gate: Gate, **options: object,
                    ) -> tuple[GroupCommit[int, list[int]], threading.Thread]:
    """A group commit whose flush of item 0 (by a thread) is held at ``gate``."""
    group = commits(gate, **options)
    gate.hold()
    first = start(lambda: group.commit(0))
    assert gate.entered.wait(10)
    return group, first


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def start(target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target)
    thread.start()
    return thread


def test_commit_uncontended_flushes_each_item_alone_in_the_callers_thread() -> None:
    threads: list[str] = []
    group: GroupCommit[int, list[int]] = GroupCommit(
        lambda batch: threads.append(threading.current_thread().name), list, list.append)
    for item in range(3):
        group.commit(item)
    assert threads == [threading.current_thread().name] * 3
    assert group.pending() == 0


def test_commit_while_a_flush_runs_coalesces_the_arrivals_into_one_round_in_order() -> None:
    gate = Gate()
    group, first = held_in_a_flush(gate)
    rounds = [group.submit(item) for item in range(1, 21)]
    waiters = [start(lambda r=r: group.wait(r)) for r in rounds]  # type: ignore[misc]
    wait_until(lambda: group.pending() == 21)
    gate.release.set()
    for thread in [first, *waiters]:
        thread.join(10)
    assert gate.batches == [[0], list(range(1, 21))]  # one flush for the 20, in submit order
    assert all(r is rounds[0] and r.done and r.error is None for r in rounds)


def test_submit_beyond_max_size_or_alone_opens_a_new_round_flushed_in_order() -> None:
    gate = Gate()
    group, first = held_in_a_flush(gate, max_size=10)
    sizes = {1: 4, 2: 6, 3: 1, 4: 30, 5: 1, 6: 1}  # 4 exceeds alone; 6 goes alone
    rounds = [group.submit(item, sizes[item], alone=item == 6) for item in sizes]
    rounds.append(group.submit(7))
    gate.release.set()
    group.wait(rounds[-1])
    first.join(10)
    assert gate.batches == [[0], [1, 2], [3], [4], [5], [6], [7]]
    assert [r.number for r in rounds] == [2, 2, 3, 4, 5, 6, 7]


def test_flush_failing_fails_every_waiter_of_its_round_and_not_later_ones() -> None:
    gate = Gate(fail_when=lambda batch: 1 in batch)
    group, first = held_in_a_flush(gate)
    failing = group.submit(1)
    group.submit(2)  # same round as 1
    outcomes: dict[int, str] = {}
    lock = threading.Lock()

    def wait_for(item: int, round_: object) -> None:
        try:
            group.wait(round_)  # type: ignore[arg-type]
            result = "ok"
        except OSError as exc:
            result = str(exc)
        with lock:
            outcomes[item] = result

    waiters = [start(lambda i=i: wait_for(i, failing)) for i in (1, 2)]  # type: ignore[misc]
    wait_until(lambda: len(failing._waiters or ()) == 2)
    gate.release.set()
    for thread in [first, *waiters]:
        thread.join(10)
    group.commit(3)  # the next round: flushed and not failed
    assert outcomes == {1: "[Errno 28] flush of [1, 2] failed",
                        2: "[Errno 28] flush of [1, 2] failed"}
    assert gate.batches == [[0], [1, 2], [3]]
    with pytest.raises(OSError, match=r"flush of \[1, 2\] failed"):
        group.wait(failing)  # a late waiter of that round gets its error too


def test_flush_failing_with_requeue_keeps_the_items_for_the_next_round() -> None:
    gate = Gate(fail_when=lambda batch: len(gate.batches) == 1)

    def prepend(failed: list[int], later: list[int]) -> None:
        later[:0] = failed

    group: GroupCommit[int, list[int]] = GroupCommit(gate, list, list.append, requeue=prepend)
    failed = group.submit(1)
    with pytest.raises(OSError):
        group.wait(failed)
    assert group.pending() == 0 and group.oldest() is not None  # the items wait in a new round
    group.commit(2)
    assert gate.batches == [[1], [1, 2]]


def test_wait_past_its_timeout_returns_false_and_leaves_the_item_queued() -> None:
    gate = Gate()
    group, first = held_in_a_flush(gate)
    queued = group.submit(1)
    assert group.wait(queued, timeout=0.05) is False
    gate.release.set()
    first.join(10)
    assert group.wait(queued, timeout=10) is True
    assert gate.batches == [[0], [1]]


def test_thread_without_leaders_flushes_rounds_nobody_waits_for() -> None:
    gate = Gate()
    group = commits(gate, lead=False, thread_name="test-flusher")
    gate.hold()
    first = group.submit(0)
    assert gate.entered.wait(10)
    assert gate.batches == [[0]] and threading.current_thread().name != "test-flusher"
    later = [group.submit(item) for item in (1, 2, 3)]
    event = group.done_event(later[0])
    assert not event.is_set()
    gate.release.set()
    assert event.wait(10)
    group.waiter(later[-1])()
    assert first.done and gate.batches == [[0], [1, 2, 3]]
    assert group.done_event(first).is_set()  # made after the round was done: set at once


def test_thread_lingers_so_that_items_nobody_waits_for_join_one_round() -> None:
    gate = Gate()
    group = commits(gate, thread_name="test-linger", linger_s=0.2)
    rounds = [group.submit(item) for item in range(5)]
    event = group.done_event(rounds[-1])
    assert event.wait(10)
    assert gate.batches == [[0, 1, 2, 3, 4]]


def test_close_lets_the_thread_flush_what_is_queued_then_refuses_items() -> None:
    gate = Gate()
    group = commits(gate, thread_name="test-close", linger_s=30.0)
    queued = group.submit(1)
    group.submit(2)
    started = time.monotonic()
    group.close(timeout=10)  # ends the linger at once
    assert time.monotonic() - started < 5
    assert queued.done and gate.batches == [[1, 2]]
    with pytest.raises(GroupCommitClosedError, match="test-close is closed"):
        group.submit(3)


def test_amend_changes_queued_rounds_not_the_one_being_flushed() -> None:
    gate = Gate()
    group, first = held_in_a_flush(gate)
    queued = group.submit(1)
    group.submit(2)
    group.amend(lambda batch: batch.remove(1) if 1 in batch else None)
    group.amend(lambda batch: batch.remove(0) if 0 in batch else None)  # not queued: kept
    gate.release.set()
    group.wait(queued)
    first.join(10)
    assert gate.batches == [[0], [2]]


def test_commit_from_many_threads_flushes_each_item_once_in_each_threads_order() -> None:
    flushed: list[tuple[int, int]] = []
    flushes = [0]

    def flush(batch: list[tuple[int, int]]) -> None:
        flushes[0] += 1
        time.sleep(0.0005)  # a sync: what arrives meanwhile joins the next round
        flushed.extend(batch)

    group: GroupCommit[tuple[int, int], list[tuple[int, int]]] = GroupCommit(
        flush, list, list.append)
    errors: list[BaseException] = []

    def writer(thread: int) -> None:
        try:
            for item in range(200):
                group.commit((thread, item))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [start(lambda t=t: writer(t)) for t in range(8)]  # type: ignore[misc]
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sorted(flushed) == [(t, i) for t in range(8) for i in range(200)]
    for t in range(8):
        assert [i for th, i in flushed if th == t] == list(range(200))
    assert flushes[0] < 8 * 200  # rounds were shared


def test_commit_queue_failed_fsync_fails_only_the_members_that_asked_for_it() -> None:
    def write(group: list[CommitRequest[str]]) -> int:
        for request in group:
            request.result = request.payload.upper()
        return 7

    def sync(sequence: int) -> None:
        raise OSError(5, f"fsync through {sequence} failed")

    queue: CommitQueue[str] = CommitQueue(1 << 20, write, sync)
    written = CommitRequest("w", 1, fsync=False)
    assert queue.submit(written) == "W" and written.sequence == 7
    with pytest.raises(OSError, match="fsync through 7 failed"):
        queue.submit(CommitRequest("f", 1, fsync=True))


def test_commit_queue_failed_write_fails_the_request_and_not_the_next() -> None:
    calls: list[list[str]] = []

    def write(group: list[CommitRequest[str]]) -> int:
        calls.append([r.payload for r in group])
        if group[0].payload == "bad":
            raise OSError(28, "No space left on device")
        for request in group:
            request.result = len(calls)
        return len(calls)

    queue: CommitQueue[str] = CommitQueue(1 << 20, write, lambda _seq: None)
    with pytest.raises(OSError, match="No space left"):
        queue.submit(CommitRequest("bad", 1, fsync=True, atomic=True))
    assert queue.submit(CommitRequest("good", 1, fsync=True)) == 2
    assert calls == [["bad"], ["good"]]

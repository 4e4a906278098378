"""How a subscription runs its handlers: the thread that reads a batch runs a handler itself.

These pin the promises that must survive that (docs/groups.md, "Push"): leases
start in delivery order, one handler slot means one thread in offset order, a
handler that blocks never holds up the messages behind it, and stop() ends the
subscription even when every handler thread is stuck.
"""

from __future__ import annotations

import threading
import time

from npstream.groups.shared import Lease

# Guards against a hung test only; nothing is asserted about durations.
GUARD_S = 30.0


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out after {GUARD_S}s waiting for {what}")


def test_one_slot_runs_every_handler_on_one_thread_in_offset_order(client, stream_name):
    client.create_stream(stream_name)
    client.publish_batch(stream_name, [{"value": f"m{i}"} for i in range(40)])
    seen: list[tuple[int, str]] = []

    def handle(lease: Lease) -> None:
        seen.append((lease.offset, threading.current_thread().name))

    with client.subscribe(stream_name, "g", handle, max_in_flight=1):
        for i in range(40, 60):  # these arrive one at a time, while the subscription runs
            client.publish(stream_name, f"m{i}")
        wait_until(lambda: len(seen) == 60, "60 handled messages")
    assert [offset for offset, _ in seen] == list(range(60))
    assert len({thread for _, thread in seen}) == 1
    assert client.describe_group(stream_name, "g").committed_offset == 60


def test_blocked_handler_does_not_hold_up_later_messages(client, stream_name):
    client.create_stream(stream_name)
    release = threading.Event()
    started = threading.Event()
    handled: list[int] = []
    lock = threading.Lock()

    def handle(lease: Lease) -> None:
        if lease.offset == 0:
            started.set()
            assert release.wait(GUARD_S), "never released"
        with lock:
            handled.append(lease.offset)

    with client.subscribe(stream_name, "g", handle, max_in_flight=4):
        client.publish(stream_name, "m0")
        assert started.wait(GUARD_S)
        # The thread that read offset 0 is stuck in its handler: the later messages,
        # each its own batch, are read and handled by the others meanwhile.
        for i in range(1, 4):
            client.publish(stream_name, f"m{i}")
        wait_until(lambda: sorted(handled) == [1, 2, 3], "offsets 1-3 while 0 blocks")
        release.set()
        wait_until(lambda: len(handled) == 4, "offset 0 after release")
        wait_until(lambda: client.describe_group(stream_name, "g").committed_offset == 4,
                   "all acked")


def test_stop_ends_the_subscription_when_every_handler_thread_is_stuck(client, stream_name):
    client.create_stream(stream_name)
    client.publish(stream_name, "m0")
    release = threading.Event()
    started = threading.Event()

    def handle(lease: Lease) -> None:
        started.set()
        release.wait(GUARD_S)

    sub = client.subscribe(stream_name, "g", handle, max_in_flight=1)
    try:
        assert started.wait(GUARD_S)
        # Its only thread is in the handler, so no thread reads the call's end.
        sub.stop(timeout=0.2)
        sub.join(GUARD_S)
        assert not sub.running
    finally:
        release.set()
    # The stuck handler's lease is settled by a unary ack once it returns.
    wait_until(lambda: client.describe_group(stream_name, "g").committed_offset == 1,
               "the late ack")


def test_fast_handlers_run_on_a_few_threads_whatever_max_in_flight(client, stream_name):
    """Threads start only as handlers block (a watchdog), not one per unsettled lease."""
    client.create_stream(stream_name)
    client.publish_batch(stream_name, [{"value": f"m{i}"} for i in range(5000)])
    threads: set[str] = set()
    handled: list[int] = []
    lock = threading.Lock()

    def handle(lease: Lease) -> None:
        with lock:
            threads.add(threading.current_thread().name)
            handled.append(lease.offset)

    with client.subscribe(stream_name, "g", handle, max_in_flight=1000):
        wait_until(lambda: len(handled) == 5000, "5000 handled messages")
    assert sorted(handled) == list(range(5000))
    # One thread per in-flight lease would be ~1000; a watchdog tick (2 ms) with no
    # progress adds one, so a loaded machine may add a few.
    assert len(threads) <= 100, len(threads)


def test_blocked_handler_does_not_hold_up_the_rest_of_its_batch(client, stream_name):
    """The leases behind a stuck one in the same batch are run by another thread."""
    client.create_stream(stream_name)
    client.publish_batch(stream_name, [{"value": f"m{i}"} for i in range(200)])
    release = threading.Event()
    handled: list[int] = []
    lock = threading.Lock()

    def handle(lease: Lease) -> None:
        if lease.offset == 0:
            assert release.wait(GUARD_S), "never released"
        with lock:
            handled.append(lease.offset)

    try:
        with client.subscribe(stream_name, "g", handle, max_in_flight=500):
            wait_until(lambda: sorted(handled) == list(range(1, 200)), "offsets 1-199")
            release.set()
            wait_until(lambda: len(handled) == 200, "offset 0 after release")
            wait_until(lambda: client.describe_group(stream_name, "g").committed_offset == 200,
                       "all acked")
    finally:
        release.set()


def test_leases_of_one_batch_settle_independently(client, stream_name):
    """A batch's leases share one list of settled states: each keeps its own slot."""
    client.create_stream(stream_name)
    client.publish_batch(stream_name, [{"value": f"m{i}"} for i in range(300)])
    seen: dict[int, Lease] = {}
    lock = threading.Lock()

    def handle(lease: Lease) -> None:
        assert lease.settled == ""
        if lease.offset % 3 == 1:
            lease.ack()
        elif lease.offset % 3 == 2 and lease.attempt == 1:
            lease.nack()
        with lock:
            seen.setdefault(lease.offset * 10 + lease.attempt, lease)

    with client.subscribe(stream_name, "g", handle, max_in_flight=1000) as sub:
        wait_until(lambda: client.describe_group(stream_name, "g").committed_offset == 300,
                   "all acked")
        stats = sub.stats()
    firsts = {key // 10: lease for key, lease in seen.items() if key % 10 == 1}
    assert sorted(firsts) == list(range(300))
    assert {offset: lease.settled for offset, lease in firsts.items()} == {
        offset: ("ack", "ack", "nack")[offset % 3] for offset in range(300)}
    assert stats.nacks == 100 and stats.acks == 300
    assert all(lease.value == f"m{lease.offset}".encode() and lease.id for lease in firsts.values())
    assert len({id(lease) for lease in firsts.values()}) == 300

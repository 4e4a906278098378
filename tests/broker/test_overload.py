"""Overload (issue 18): the publish memory budget pushes a flood back instead of growing memory.

``test_publish_flood_stays_within_the_memory_bound`` floods a real broker
from 8 processes of 8 threads each (one connection per process) with 3 MB
unary publishes (192 MB asked for at once, 576 MB in all) while a thread
samples the broker's resident memory from /proc and the budget's gauge
from its metrics. With ``max_publish_bytes_in_flight = 16MiB`` the bytes in
flight never pass the budget and the RSS peak stays within the rule of
thumb docs/broker.md ("Overload") gives: idle RSS + ``retain_freed_memory``
+ 16 x the budget + 64 MiB (384 MiB here; measured +190..330 MiB; the same
flood without the budget measured +310..360 MiB, and before Publish used its
request bytes in place +600..640 MiB: docs/broker.md says what the budget
does and does not bound). The broker refuses some
calls (the overloaded counter grows), the SDK retries them, one process
retries by hand on ``Overloaded`` (retry_deadline 0), and every message the
broker acknowledged is stored exactly once.

The unit tests below pin the budget's rules and the SDK's retry of OVERLOADED.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest
from integrity import read_back

from harness import SUPPORT_DIR, BrokerProcess
from npstream import Client, Overloaded
from npstream.broker.errors import OverloadedError, ShuttingDownError
from npstream.broker.rpc.budget import PublishBudget
from npstream.broker.rpc.tuning import MIN_UNREAD_CALLS
from npstream.client.connection import Connection
from npstream.proto import metadata_keys, pb

MIB = 1 << 20
BUDGET = 16 * MIB
RETAIN = 64 * MIB
BOUND = RETAIN + 16 * BUDGET + 64 * MIB  # above the idle RSS (docs/broker.md, Overload)
PROCESSES, THREADS, REQUESTS, ROWS, ROW_BYTES = 8, 8, 3, 3, 1_000_000
PUBLISHER = SUPPORT_DIR / "overload_publisher.py"
STREAM = "flood"


@pytest.mark.slow
def test_publish_flood_stays_within_the_memory_bound(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", env={
        "NPSTREAM_MAX_PUBLISH_BYTES_IN_FLIGHT": f"{BUDGET}",
        "NPSTREAM_RETAIN_FREED_MEMORY": f"{RETAIN}",
        "NPSTREAM_DEFAULT_MAX_MESSAGE_BYTES": "2MiB",
    }).start()
    try:
        with Client(broker.address) as client:
            client.create_stream(STREAM, max_bytes=0)
            client.publish(STREAM, b"warm-up", id="warm-up")
        time.sleep(0.5)
        idle = broker.rss()
        peak = idle
        done = threading.Event()

        in_flight: list[float] = []

        def sample() -> None:
            nonlocal peak
            rounds = 0
            while not done.is_set():
                peak = max(peak, broker.rss())
                rounds += 1
                if rounds % 5 == 0:  # the budget's own gauge, from the metrics endpoint
                    in_flight.append(broker.metrics()["npstream_publish_bytes_in_flight"])
                time.sleep(0.01)

        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.monotonic()
        publishers = [subprocess.Popen([
            sys.executable, str(PUBLISHER), broker.address, STREAM, f"p{n}", str(THREADS),
            str(REQUESTS), str(ROWS), str(ROW_BYTES), str(tmp_path / f"p{n}.json"),
            "0" if n == 0 else "60"]) for n in range(PROCESSES)]
        try:
            for publisher in publishers:
                assert publisher.wait(timeout=240) == 0
        finally:
            done.set()
            sampler.join()
            for publisher in publishers:
                publisher.kill()
        elapsed = time.monotonic() - started
        results = [json.loads((tmp_path / f"p{n}.json").read_text()) for n in range(PROCESSES)]
        metrics = broker.metrics()

        print(f"flood: {PROCESSES * THREADS * REQUESTS * ROWS} messages in {elapsed:.1f}s, "
              f"RSS idle {idle / MIB:.0f} MiB, peak +{(peak - idle) / MIB:.0f} MiB (bound "
              f"{BOUND / MIB:.0f}), {metrics['npstream_publish_overloaded_total']:.0f} refusals")
        assert peak - idle <= BOUND, (
            f"broker RSS peaked at {peak / MIB:.0f} MiB, {(peak - idle) / MIB:.0f} MiB above idle "
            f"({idle / MIB:.0f} MiB): over the bound of {BOUND / MIB:.0f} MiB")
        assert in_flight and max(in_flight) <= BUDGET, f"in flight: {max(in_flight)} bytes"
        assert not [e for r in results for e in r["errors"]]
        assert metrics["npstream_publish_overloaded_total"] > 0, "the flood was never pushed back"
        assert metrics["npstream_publish_bytes_in_flight"] == 0
        by_hand = results[0]["overloaded"]  # the process without SDK retries
        assert by_hand, "a client with retry_deadline=0 should have seen Overloaded"
        assert all(o["retry_after"] > 0 and "nothing was stored" in o["message"]
                   for o in by_hand)

        acked = [i for r in results for i in r["acked"]]
        assert len(acked) == PROCESSES * THREADS * REQUESTS * ROWS
        with Client(broker.address) as client:
            stored = Counter(read_back(client, STREAM).column("id").to_pylist())
        assert stored["warm-up"] == 1
        missing = [i for i in acked if stored[i] != 1]
        assert not missing, f"{len(missing)} acknowledged messages not stored exactly once"
    finally:
        broker.stop()


# ---------------------------------------------------------------- the budget's rules

def test_the_budget_admits_what_fits_and_refuses_after_the_wait() -> None:
    budget = PublishBudget(10)
    budget.acquire(6, "a", wait_s=0)
    budget.acquire(4, "b", wait_s=0)
    started = time.monotonic()
    with pytest.raises(OverloadedError) as refused:
        budget.acquire(1, "publish to stream 'x'", wait_s=0.05)
    assert time.monotonic() - started >= 0.05
    assert "publish to stream 'x' (1 bytes)" in str(refused.value)
    assert "nothing was stored" in str(refused.value)
    assert refused.value.retry_after_ms > 0
    budget.release(6)
    budget.acquire(5, "c", wait_s=0)
    assert budget.in_flight == 9


def test_a_request_larger_than_the_budget_runs_alone() -> None:
    budget = PublishBudget(10)
    budget.acquire(50, "big", wait_s=0)  # nothing else in flight: admitted
    with pytest.raises(OverloadedError):
        budget.acquire(1, "small", wait_s=0)
    budget.release(50)
    budget.acquire(1, "small", wait_s=0)


def test_a_waiting_stream_request_is_admitted_when_room_frees_or_ends() -> None:
    budget = PublishBudget(10)
    budget.acquire(10, "held", wait_s=0)
    threading.Timer(0.1, budget.release, args=(10,)).start()
    budget.acquire(8, "stream request", wait_s=None)  # waits, no refusal
    with pytest.raises(ShuttingDownError):
        budget.acquire(8, "stream request", wait_s=None, should_stop=lambda: True)


def test_calls_are_refused_before_they_are_read_once_the_budget_is_full() -> None:
    budget = PublishBudget(10)
    tickets = [budget.admit_call() for _ in range(MIN_UNREAD_CALLS)]
    assert None not in tickets
    assert budget.admit_call() is None  # too many admitted calls not read yet
    budget.call_read(tickets[0])
    budget.acquire(10, "read", wait_s=0)
    assert budget.admit_call() is None  # the bytes in flight are at the budget
    budget.release(10)
    assert budget.admit_call() is not None


# ---------------------------------------------------------------- the SDK's retry

class _Refused(grpc.RpcError):
    def __init__(self, retry_after_ms: int) -> None:
        self._meta = ((metadata_keys.REASON, pb.ErrorReason.Name(pb.ERROR_REASON_OVERLOADED)),
                      (metadata_keys.RETRY_AFTER_MS, str(retry_after_ms)))

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self) -> str:
        return "broker overloaded: publish ... nothing was stored"

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._meta


def test_the_sdk_retries_overloaded_even_for_calls_that_are_not_idempotent() -> None:
    connection = Connection("127.0.0.1:1", retry_deadline=5)
    calls: list[float] = []

    def send() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise _Refused(60)
        return "stored"

    try:
        assert connection._retrying("StreamService.Publish", send, idempotent=False) == "stored"
    finally:
        connection.close()
    assert len(calls) == 3
    assert all(later - earlier >= 0.06 for earlier, later in itertools.pairwise(calls))


def test_the_sdk_raises_overloaded_after_its_retry_deadline() -> None:
    connection = Connection("127.0.0.1:1", retry_deadline=0.3)

    def send() -> str:
        raise _Refused(100)

    try:
        with pytest.raises(Overloaded) as raised:
            connection._retrying("StreamService.Publish", send, idempotent=True)
    finally:
        connection.close()
    assert raised.value.retry_after == 0.1
    assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED

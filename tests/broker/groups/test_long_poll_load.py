"""1,000 open long polls and slow subscribers do not starve publishers (issue 18).

A real broker with its default configuration. The test measures the
latency of sequential publishes to one stream (ack=write: what long polls
could take from publishers is threads and CPU; fsync times on this shared
machine vary by more than 2x on their own), in
blocks that alternate between the broker otherwise idle and the broker
holding ``NPSTREAM_LONG_POLLS`` (default 1,000) long polls that another
process (long_poll_load.py) keeps open on idle streams, half shared-group
receives and half cursor-group pulls, while a few slow subscribers consume
the published stream one message every 200 ms. Alternating blocks share
the machine's noise (other processes, the disk) between both sides. The
p99 under load must stay within 2x of the idle p99, and every long poll must
still be open after each loaded block (none refused, none ended early).

Before issue 18 the broker had 64 worker threads and each waiting call holds
one: the 65th long poll queued, and publishes behind it waited out the
polls (the SDK's 30 s deadline).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from harness import SUPPORT_DIR
from npstream import Client

pytestmark = pytest.mark.slow

LOAD = SUPPORT_DIR / "long_poll_load.py"
POLLS = int(os.environ.get("NPSTREAM_LONG_POLLS", "1000"))
SLOW_SUBSCRIBERS = 8
ROUNDS, BLOCK = 6, 100  # publishes per block; each side gets ROUNDS blocks


def _publish(client: Client, stream: str, count: int) -> list[float]:
    """Latencies in ms of ``count`` sequential one-message publishes."""
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        client.publish(stream, b"p" * 200, ack="write")
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def _p(latencies: list[float], q: float) -> float:
    ordered = sorted(latencies)
    return ordered[max(0, int(len(ordered) * q) - 1)]


def test_long_polls_and_slow_subscribers_do_not_starve_publishers(broker, client, stream_name):
    client.create_stream(stream_name)
    _publish(client, stream_name, 100)  # warm: the stream's files, the channel, the caches
    load = subprocess.Popen(
        [sys.executable, str(LOAD), broker.address, stream_name, str(POLLS),
         str(SLOW_SUBSCRIBERS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert load.stdin is not None and load.stdout is not None

    def command(text: str) -> str:
        load.stdin.write(text + "\n")  # type: ignore[union-attr]
        load.stdin.flush()  # type: ignore[union-attr]
        return load.stdout.readline().strip()  # type: ignore[union-attr]

    idle: list[float] = []
    loaded: list[float] = []
    try:
        for _ in range(ROUNDS):
            idle += _publish(client, stream_name, BLOCK)
            assert command("open") == "opened"
            time.sleep(2)  # every call has reached the broker and waits
            loaded += _publish(client, stream_name, BLOCK)
            assert command("count") == str(POLLS)  # all still waiting: none ended or failed
            assert command("close") == "closed"
            time.sleep(1)  # the broker has let go of the cancelled calls
        out, err = load.communicate("", timeout=120)
    finally:
        load.kill()
    assert load.returncode == 0, err[-3000:]
    stats = json.loads(out.strip().splitlines()[-1])
    idle_p99, loaded_p99 = _p(idle, 0.99), _p(loaded, 0.99)
    print(f"publish ms idle p50 {_p(idle, 0.5):.2f} p99 {idle_p99:.2f}; with {POLLS} long "
          f"polls and {SLOW_SUBSCRIBERS} slow subscribers p50 {_p(loaded, 0.5):.2f} p99 "
          f"{loaded_p99:.2f}; load {stats}")
    assert stats["errors"] == 0 and stats["ended_early"] == 0, stats
    assert stats["issued"] == ROUNDS * POLLS
    assert stats["handled"] > 0  # the slow subscribers were consuming
    assert loaded_p99 <= 2 * idle_p99, (idle_p99, loaded_p99)

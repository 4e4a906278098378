"""Soak with nothing lost (issue 18): load, kill -9 cycles, and an exact account at the end.

For ``NPSTREAM_SOAK_SECONDS`` (default 25; the issue's long run is 600) a real
broker serves at once:

* publishers with producer ids (single messages and batches of 50, ack=fsync
  and ack=write, on two streams), retrying through every restart with the
  same ids;
* a cursor-group consumer that pulls without auto-commit, checks each
  pull continues exactly where its last acknowledged commit left off, and
  commits;
* two shared-group consumers that receive and ack, checking that no message
  below an acknowledged committed position is ever delivered again;
* a Spark-free exactly-once sink writer (SinkClient stage + commit, batch by
  batch, into a stream without dedup, so only the sink protocol can keep it
  exactly once);

while the broker is killed with SIGKILL at random moments and restarted on
the same data dir and port. At the end (after a clean stop): every segment
file walks cleanly, every acknowledged publish is stored exactly once and no
id at all is stored twice (ids are deduplicated), no acknowledged group
position went backwards, the shared group has acked every message, and
every committed sink batch is in its stream exactly once. The figures are
printed (run with ``-s``): messages, restarts, lost, duplicated, peak RSS.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from integrity import check_files, check_streams, read_back

from harness import BrokerProcess
from npstream import Client, NpstreamError
from npstream.client import group_rpc

SECONDS = float(os.environ.get("NPSTREAM_SOAK_SECONDS", "25"))
STREAMS = ("soak-a", "soak-b")
CURSOR_STREAM, SHARED_STREAM, SINK_STREAM = "soak-a", "soak-b", "soak-sink"
KILL_EVERY_S = (1.5, 4.0)
RETRY_S = 60.0  # clients ride out any restart


@dataclass
class Ledger:
    """What the broker acknowledged, and what the consumers saw (shared by the threads)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    acked_ids: dict[str, list[str]] = field(default_factory=lambda: {s: [] for s in STREAMS})
    cursor_committed: int = 0
    cursor_pulled: int = 0
    shared_position: int = 0
    shared_acked: set[int] = field(default_factory=set)
    shared_redelivered: int = 0
    sink_batches: list[int] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(text)


def _retrying(stop: threading.Event, ledger: Ledger, what: str, call: Callable[[], object],
              ) -> object:
    """``call()`` until it succeeds (the broker may be down for a while); None if stopping."""
    while not stop.is_set():
        try:
            return call()
        except NpstreamError as exc:  # the SDK gave up on a restart, or a call cut by a kill
            with ledger.lock:
                ledger.errors.append(f"{what}: {type(exc).__name__}")
            time.sleep(0.2)
    return None


def publisher(address: str, number: int, stop: threading.Event, ledger: Ledger) -> None:
    stream = STREAMS[number % 2]
    ack = "write" if number % 3 == 2 else "fsync"
    with Client(address, retry_deadline=RETRY_S) as client:
        sequence = 0
        while not stop.is_set():
            if sequence % 4 == 3:  # a batch of 50 with ids: safe to resend whole
                ids = [f"pub-{number}-{sequence}-{i}" for i in range(50)]
                table = pa.table({"value": [i.encode() for i in ids], "id": ids})
                done = _retrying(stop, ledger, "publish_batch",
                                 lambda t=table: client.publish_batch(stream, t, ack=ack))
            else:
                ids = [f"pub-{number}-{sequence}"]
                done = _retrying(stop, ledger, "publish", lambda i=ids[0]: client.publish(
                    stream, i.encode(), id=i, ack=ack))
            if done is not None:
                with ledger.lock:
                    ledger.acked_ids[stream].extend(ids)
            sequence += 1


def cursor_consumer(address: str, stop: threading.Event, ledger: Ledger) -> None:
    with Client(address, retry_deadline=RETRY_S) as client:
        consumer = _retrying(stop, ledger, "open", lambda: client.consumer(CURSOR_STREAM, "cursor"))
        while consumer is not None and not stop.is_set():
            table = _retrying(stop, ledger, "pull",
                              lambda: consumer.pull(200, wait=0.2, auto_commit=False))
            if not table:
                continue
            offsets = table.offsets
            with ledger.lock:
                committed = ledger.cursor_committed
            if offsets[0] != committed:  # a pull starts at the group's durable position
                ledger.violation(f"cursor pull started at {offsets[0]}, the last acknowledged "
                                 f"commit was {committed}")
            if offsets != list(range(offsets[0], offsets[0] + len(offsets))):
                ledger.violation(f"cursor pull not contiguous: {offsets[:5]}...")
            position = _retrying(stop, ledger, "commit",
                                 lambda o=offsets[-1]: consumer.commit(next_offset=o + 1))
            if position is not None:
                with ledger.lock:
                    ledger.cursor_committed = int(position)  # type: ignore[call-overload]
                    ledger.cursor_pulled += len(offsets)


def shared_consumer(address: str, member: str, stop: threading.Event, ledger: Ledger) -> None:
    with Client(address, retry_deadline=RETRY_S) as client:
        while not stop.is_set():
            with ledger.lock:  # durable before this receive starts (another member may ack
                known = ledger.shared_position  # while it runs: later positions prove nothing)
            leases = _retrying(stop, ledger, "receive", lambda: client.receive(
                SHARED_STREAM, "shared", 100, wait=0.2, member_id=member))
            if not leases:
                continue
            offsets = [lease.offset for lease in leases]  # type: ignore[attr-defined]
            below = [o for o in offsets if o < known]
            with ledger.lock:
                ledger.shared_redelivered += sum(o in ledger.shared_acked for o in offsets)
            if below:
                ledger.violation(f"shared group delivered {below[:5]} below its acknowledged "
                                 f"committed position {known}")
            response = _retrying(stop, ledger, "ack", lambda o=offsets: group_rpc.ack(
                client, SHARED_STREAM, "shared", o, member_id=member))
            if response is not None:
                with ledger.lock:
                    if response.acked:  # type: ignore[attr-defined]
                        ledger.shared_acked.update(offsets)
                    position = response.position.committed_offset  # type: ignore[attr-defined]
                    ledger.shared_position = max(ledger.shared_position, position)


def sink_writer(address: str, stop: threading.Event, ledger: Ledger) -> None:
    with Client(address, retry_deadline=RETRY_S) as client:
        _retrying(stop, ledger, "create", lambda: client.create_stream(
            SINK_STREAM, dedup_window=0, max_bytes=0, exist_ok=True))
        sink = client.sink(local_staging=False)
        batch = 0
        while not stop.is_set():
            rows = pa.table({"value": [f"sink-{batch}-{i}".encode() for i in range(40)],
                             "id": [f"sink-{batch}-{i}" for i in range(40)]})
            staged = _retrying(stop, ledger, "stage", lambda r=rows, b=batch: sink.stage(
                "soak", b, f"{b}-0", SINK_STREAM, r))
            committed = staged is not None and _retrying(
                stop, ledger, "commit", lambda b=batch: sink.commit("soak", b, [f"{b}-0"]))
            if committed:
                with ledger.lock:
                    ledger.sink_batches.append(batch)
                batch += 1


def rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status
                        if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


@pytest.mark.slow
@pytest.mark.timeout(max(300, int(SECONDS * 3) + 180))
def test_soak_kill_9_nothing_acknowledged_is_lost(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    ledger = Ledger()
    stop = threading.Event()
    with Client(broker.address) as client:
        for stream in STREAMS:
            client.create_stream(stream, max_bytes=0, max_age=0)
    workers = [threading.Thread(target=publisher, args=(broker.address, n, stop, ledger))
               for n in range(4)]
    workers.append(threading.Thread(target=cursor_consumer, args=(broker.address, stop, ledger)))
    workers += [threading.Thread(target=shared_consumer, args=(broker.address, f"m{n}", stop,
                                                               ledger)) for n in range(2)]
    workers.append(threading.Thread(target=sink_writer, args=(broker.address, stop, ledger)))
    started = time.monotonic()
    for worker in workers:
        worker.start()
    restarts, peak_rss = 0, 0
    rng = random.Random(int(os.environ.get("NPSTREAM_SOAK_SEED", "18")))
    try:
        while time.monotonic() - started < SECONDS:
            deadline = time.monotonic() + rng.uniform(*KILL_EVERY_S)
            while time.monotonic() < deadline:
                peak_rss = max(peak_rss, rss(broker.pid))
                time.sleep(0.05)
            broker.kill()  # SIGKILL at a random moment of the load
            broker.start()
            restarts += 1
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=120)
    elapsed = time.monotonic() - started
    assert not [w for w in workers if w.is_alive()], "a worker hung"
    assert broker.stop() == 0
    check_files(broker.data_dir)  # every frame's CRC, contiguous offsets
    broker.start()
    try:
        with Client(broker.address) as client:
            check_streams(client)
            lost = duplicated = acked_total = 0
            for stream in STREAMS:
                stored = Counter(read_back(client, stream).column("id").to_pylist())
                acked = ledger.acked_ids[stream]
                acked_total += len(acked)
                lost += sum(1 for i in acked if stored[i] == 0)
                duplicated += sum(count - 1 for count in stored.values() if count > 1)
            # Drain the shared group: every message of its stream gets acked at last.
            end = client.stream_info(SHARED_STREAM).end_offset
            drain_stop = threading.Event()
            drain = threading.Thread(target=shared_consumer,
                                     args=(broker.address, "drain", drain_stop, ledger))
            drain.start()
            drain_deadline = time.monotonic() + 60
            while ledger.shared_position < end and time.monotonic() < drain_deadline:
                time.sleep(0.1)
            drain_stop.set()
            drain.join()
            cursor = client.consumer(CURSOR_STREAM, "cursor").position
            sink_ids = Counter(read_back(client, SINK_STREAM).column("id").to_pylist())
            last_batch = client.sink().last_batch_id("soak")
        figures = (f"soak {elapsed:.0f}s: {acked_total} acknowledged publishes, {restarts} kill -9 "
                   f"restarts, {lost} lost, {duplicated} duplicated; cursor group pulled "
                   f"{ledger.cursor_pulled} (position {cursor}), shared group acked "
                   f"{len(ledger.shared_acked)} ({ledger.shared_redelivered} redeliveries of "
                   f"acked messages), {len(ledger.sink_batches)} sink batches; peak RSS "
                   f"{peak_rss >> 20} MiB; {len(ledger.errors)} client errors retried")
        print(figures)
        assert restarts >= 1
        assert acked_total > 0 and ledger.cursor_pulled > 0 and ledger.sink_batches
        assert not ledger.violations, ledger.violations[:10]
        assert lost == 0, figures
        assert duplicated == 0, figures
        assert cursor >= ledger.cursor_committed
        assert ledger.shared_position >= end, f"shared group stuck at {ledger.shared_position}"
        committed_batches = ledger.sink_batches
        assert last_batch == committed_batches[-1]
        expected = Counter(f"sink-{b}-{i}" for b in range(last_batch + 1) for i in range(40))
        assert sink_ids == expected, "the sink stream is not every committed batch exactly once"
    finally:
        broker.stop()

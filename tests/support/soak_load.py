"""The soak (issue 18), shared by tests/broker/test_soak.py and bench/soak.py.

One ``run_soak`` does everything, so the suite's short run and the bench's
long one are the same soak (the rules live here once). Until
``SoakConfig.kills`` kill -9s are done (or for ``SoakConfig.seconds``) a real
broker serves at once:

* publishers with producer ids (single messages and batches of 50, ack=fsync
  and ack=write) spread over ``streams`` streams, retrying through every
  restart with the same ids; each value carries the CRC32 of its body, so a
  stored message that changed shows up as a bad checksum;
* a cursor-group consumer (pull without auto-commit; each pull must continue
  exactly where its last acknowledged commit left off; commit);
* a shared group with two pull members (receive, ack; nothing below an
  acknowledged committed position is ever delivered again) and a push member
  (``client.subscribe``: its reconnect loop must carry it across every
  restart);
* a Spark-free exactly-once sink writer (SinkClient stage + commit into a
  stream without dedup, so only the sink protocol keeps it exactly once);
* with a SparkSession given, a streaming query copying every publisher stream
  into one target through the exactly-once sink. It runs in the caller's
  process and is expected to ride out every restart (the client retries
  UNAVAILABLE with backoff); if it fails anyway it is restarted from its
  checkpoint and counted (``spark_restarts``), which the test treats as a
  failure;

while the broker is killed with SIGKILL every ``kill_every`` seconds (a random
moment in that range; with a kill count, also not before the restarted broker
acknowledged ``load_between`` publishes and a sink batch) and restarted on the
same data dir and port. Then, after
a clean stop: every segment file walks cleanly; every acknowledged publish is
stored exactly once, with a good checksum, and no id at all twice; no
acknowledged cursor position went back; the shared group and the push
subscription reach the end of their stream; every committed sink batch is in
its stream exactly once; the Spark target holds every message of the
publisher streams exactly once. ``SoakResult.problems()`` lists what failed;
``verdict()`` is the one-line summary with the figures.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from integrity import check_files, check_streams, read_back

from harness import BrokerProcess
from npstream import Client, NpstreamError
from npstream.client import group_rpc

__all__ = ["SoakConfig", "SoakResult", "checksummed", "rss", "run_soak"]

log = logging.getLogger("npstream.soak")

RETRY_S = 60.0  # clients ride out any restart
SINK_STREAM, SPARK_STREAM = "soak-sink", "soak-spark"
SINK_ROWS = 40
CATCH_UP_S = 300.0  # at the end: the groups and the Spark query reach the end
PAD = b"." * 48
# With a kill count: the longest wait for the load between two kills (a violation after).
LOAD_WAIT_S = 120.0
# Leases of the shared groups: a lease whose ack a kill cut off comes back after this,
# so the drain at the end waits at most about this long for it.
ACK_WAIT_S = 5.0


@dataclass(frozen=True)
class SoakConfig:
    """What to run. ``work_dir`` holds the broker's data dir and the Spark checkpoint."""

    work_dir: Path
    seconds: float
    streams: int = 2
    publishers: int = 4
    kill_every: tuple[float, float] = (1.5, 4.0)
    seed: int = 18
    spark: Any = None  # a SparkSession: run the Spark copy query too
    # kills > 0: exactly that many kill -9s, whatever the machine's speed (``seconds`` is
    # then only reported); each after a random pause in ``kill_every`` *and* once the
    # restarted broker took ``load_between`` acknowledged publishes and a sink batch.
    # kills == 0: kill as often as fits in ``seconds``.
    kills: int = 0
    load_between: int = 100

    @property
    def stream_names(self) -> list[str]:
        return [f"soak-{n}" for n in range(self.streams)]


@dataclass
class SoakResult:
    """The account at the end; ``problems()`` is empty when nothing was lost or duplicated."""

    seconds: float = 0.0
    streams: int = 0
    restarts: int = 0
    acked: int = 0
    lost: int = 0
    duplicated: int = 0
    bad_checksums: int = 0
    cursor_pulled: int = 0
    cursor_position: int = 0
    cursor_committed: int = 0
    shared_acked: int = 0
    shared_redelivered: int = 0
    shared_position: int = 0
    shared_end: int = 0
    shared_stored: int = 0  # the group's committed position after the final restart
    push_handled: int = 0
    push_missing: int = 0
    push_error: str = ""
    sink_batches: int = 0
    sink_exact: bool = False
    spark_rows: int = 0
    spark_lost: int = 0
    spark_duplicated: int = 0
    spark_batches: int = 0
    spark_restarts: int = -1  # -1: no Spark query ran
    peak_rss: int = 0
    client_errors: int = 0
    violations: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        found = list(self.violations[:10])
        checks = [
            (self.restarts >= 1, "the broker was never restarted"),
            (self.acked > 0, "nothing was published"),
            (self.cursor_pulled > 0, "the cursor group pulled nothing"),
            (self.sink_batches > 0, "no sink batch was committed"),
            (self.lost == 0, f"{self.lost} acknowledged messages lost"),
            (self.duplicated == 0, f"{self.duplicated} messages stored twice"),
            (self.bad_checksums == 0, f"{self.bad_checksums} stored values fail their checksum"),
            (self.cursor_position >= self.cursor_committed,
             f"cursor position {self.cursor_position} behind its acknowledged commit "
             f"{self.cursor_committed}"),
            (self.shared_position >= self.shared_end,
             f"shared group stuck at {self.shared_position} of {self.shared_end}"),
            (self.shared_stored >= self.shared_position,
             f"shared group's stored position {self.shared_stored} is behind its "
             f"acknowledged {self.shared_position}"),
            (self.push_missing == 0,
             f"the push subscription never handled {self.push_missing} messages"),
            (not self.push_error, f"the push subscription ended: {self.push_error}"),
            (self.sink_exact, "the sink stream is not every committed batch exactly once"),
        ]
        if self.spark_restarts >= 0:
            checks += [
                (self.spark_lost == 0, f"the Spark copy lost {self.spark_lost} messages"),
                (self.spark_duplicated == 0,
                 f"the Spark copy stored {self.spark_duplicated} messages twice"),
                (self.spark_rows > 0, "the Spark copy wrote nothing"),
            ]
        return found + [text for ok, text in checks if not ok]

    def verdict(self) -> str:
        spark = ("no Spark query" if self.spark_restarts < 0 else
                 f"Spark copied {self.spark_rows:,} ({self.spark_lost} lost, "
                 f"{self.spark_duplicated} duplicated, {self.spark_batches} micro-batches, "
                 f"{self.spark_restarts} query restarts)")
        problems = self.problems()
        head = "PASS" if not problems else "FAIL (" + "; ".join(problems) + ")"
        return (f"soak {head}: {self.seconds:.0f}s, {self.acked:,} acknowledged messages on "
                f"{self.streams} streams, {self.restarts} kill -9 restarts, {self.lost} lost, "
                f"{self.duplicated} duplicated, {self.bad_checksums} bad checksums; cursor group "
                f"pulled {self.cursor_pulled:,}, shared group acked {self.shared_acked:,} "
                f"({self.shared_redelivered} redeliveries), push subscription handled "
                f"{self.push_handled:,}; "
                f"{self.sink_batches} sink batches exactly once; {spark}; max RSS "
                f"{self.peak_rss >> 20} MiB; {self.client_errors} client errors retried")


def checksummed(message_id: str) -> bytes:
    """The value published for ``message_id``: body, '|', CRC32 of the body in hex."""
    body = message_id.encode() + b":" + PAD
    return body + b"|" + f"{zlib.crc32(body):08x}".encode()


def checksum_ok(value: bytes) -> bool:
    body, _, crc = value.rpartition(b"|")
    return crc == f"{zlib.crc32(body):08x}".encode()


def rss(pid: int) -> int:
    """Resident set size of a process in bytes (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status
                        if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


@dataclass
class _Ledger:
    """What the broker acknowledged, and what the consumers saw (shared by the threads)."""

    streams: list[str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    acked_ids: dict[str, list[str]] = field(default_factory=dict)
    cursor_committed: int = 0
    cursor_pulled: int = 0
    shared_position: int = 0
    shared_acked: set[int] = field(default_factory=set)
    shared_redelivered: int = 0
    push_offsets: set[int] = field(default_factory=set)
    push_handled: int = 0
    sink_batches: list[int] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    errors: int = 0

    def __post_init__(self) -> None:
        self.acked_ids = {s: [] for s in self.streams}

    def violation(self, text: str) -> None:
        with self.lock:
            self.violations.append(text)


class _Soak:
    """The load threads of one run (each a method, all on one ledger and stop event)."""

    def __init__(self, config: SoakConfig, address: str) -> None:
        self.config = config
        self.address = address
        self.streams = config.stream_names
        # cursor group, shared group (pull and push members): two streams when there are
        self.cursor_stream = self.streams[0]
        self.shared_stream = self.streams[1 % len(self.streams)]
        self.ledger = _Ledger(self.streams)
        self.stop = threading.Event()

    def _retrying(self, call: Callable[[], object],
                  stop: threading.Event | None = None) -> object:
        """``call()`` until it succeeds (the broker may be down a while); None once ``stop``
        (default: the load's) is set."""
        while not (stop or self.stop).is_set():
            try:
                return call()
            except NpstreamError as exc:  # the SDK gave up on a restart, or a call cut by a kill
                log.debug("soak call failed, retrying: %s", exc)
                with self.ledger.lock:
                    self.ledger.errors += 1
                time.sleep(0.2)
        return None

    def load_mark(self) -> tuple[int, int]:
        """(acknowledged publishes, committed sink batches) so far."""
        with self.ledger.lock:
            return (sum(len(ids) for ids in self.ledger.acked_ids.values()),
                    len(self.ledger.sink_batches))

    def loaded_since(self, mark: tuple[int, int], publishes: int) -> bool:
        """Whether ``publishes`` more were acknowledged and a sink batch committed since."""
        acked, batches = self.load_mark()
        return acked - mark[0] >= publishes and batches > mark[1]

    def publisher(self, number: int) -> None:
        ack = "write" if number % 3 == 2 else "fsync"
        with Client(self.address, retry_deadline=RETRY_S) as client:
            sequence = 0
            while not self.stop.is_set():
                # every publisher writes every stream in turn: none is left empty
                stream = self.streams[(number + sequence) % len(self.streams)]
                if sequence % 4 == 3:  # a batch of 50 with ids: safe to resend whole
                    ids = [f"pub-{number}-{sequence}-{i}" for i in range(50)]
                    table = pa.table({"value": [checksummed(i) for i in ids], "id": ids})
                    done = self._retrying(
                        lambda t=table, s=stream: client.publish_batch(s, t, ack=ack))
                else:
                    ids = [f"pub-{number}-{sequence}"]
                    done = self._retrying(lambda i=ids[0], s=stream: client.publish(
                        s, checksummed(i), id=i, ack=ack))
                if done is not None:
                    with self.ledger.lock:
                        self.ledger.acked_ids[stream].extend(ids)
                sequence += 1

    def cursor_consumer(self) -> None:
        ledger = self.ledger
        with Client(self.address, retry_deadline=RETRY_S) as client:
            consumer: Any = self._retrying(lambda: client.consumer(self.cursor_stream, "cursor"))
            while consumer is not None and not self.stop.is_set():
                table: Any = self._retrying(
                    lambda: consumer.pull(200, wait=0.2, auto_commit=False))
                if not table:
                    continue
                offsets = table.offsets
                with ledger.lock:
                    committed = ledger.cursor_committed
                if offsets[0] != committed:  # a pull starts at the group's durable position
                    ledger.violation(f"cursor pull started at {offsets[0]}, the last "
                                     f"acknowledged commit was {committed}")
                if offsets != list(range(offsets[0], offsets[0] + len(offsets))):
                    ledger.violation(f"cursor pull not contiguous: {offsets[:5]}...")
                position = self._retrying(
                    lambda o=offsets[-1]: consumer.commit(next_offset=o + 1))
                if position is not None:
                    with ledger.lock:
                        ledger.cursor_committed = int(position)  # type: ignore[call-overload]
                        ledger.cursor_pulled += len(offsets)

    def shared_consumer(self, member: str, stop: threading.Event | None = None) -> None:
        ledger, stop = self.ledger, stop or self.stop
        with Client(self.address, retry_deadline=RETRY_S) as client:
            while not stop.is_set():
                # The position acknowledged before this receive starts: another member may
                # ack while it runs, so later positions prove nothing about its leases.
                with ledger.lock:
                    known = ledger.shared_position
                leases: Any = self._retrying(lambda: client.receive(
                    self.shared_stream, "shared", 100, wait=0.2, ack_wait=ACK_WAIT_S,
                    member_id=member), stop)
                if not leases:
                    continue
                offsets = [lease.offset for lease in leases]
                below = [o for o in offsets if o < known]
                with ledger.lock:
                    ledger.shared_redelivered += sum(o in ledger.shared_acked for o in offsets)
                if below:
                    ledger.violation(f"shared group delivered {below[:5]} below its "
                                     f"acknowledged committed position {known}")
                response: Any = self._retrying(lambda o=offsets: group_rpc.ack(
                    client, self.shared_stream, "shared", o, member_id=member), stop)
                if response is not None:
                    with ledger.lock:
                        if response.acked:
                            ledger.shared_acked.update(offsets)
                        ledger.shared_position = max(ledger.shared_position,
                                                     response.position.committed_offset)

    def push_handler(self, lease: Any) -> None:
        """The push member's handler: note the offset; returning acks it."""
        with self.ledger.lock:
            self.ledger.push_offsets.add(lease.offset)
            self.ledger.push_handled += 1

    def sink_writer(self) -> None:
        ledger = self.ledger
        with Client(self.address, retry_deadline=RETRY_S) as client:
            sink = client.sink(local_staging=False)
            batch = 0
            while not self.stop.is_set():
                ids = [f"sink-{batch}-{i}" for i in range(SINK_ROWS)]
                rows = pa.table({"value": [checksummed(i) for i in ids], "id": ids})
                staged = self._retrying(lambda r=rows, b=batch: sink.stage(
                    "soak", b, f"{b}-0", SINK_STREAM, r))
                committed = staged is not None and self._retrying(
                    lambda b=batch: sink.commit("soak", b, [f"{b}-0"]))
                if committed:
                    with ledger.lock:
                        ledger.sink_batches.append(batch)
                    batch += 1


class _SparkCopy:
    """The Spark query: every publisher stream into SPARK_STREAM, exactly once, restarted on
    failure from its checkpoint (counted: the soak expects none)."""

    def __init__(self, spark: Any, address: str, streams: list[str], checkpoint: Path) -> None:
        self.spark, self.address, self.streams = spark, address, streams
        self.checkpoint = str(checkpoint)
        self.restarts = 0
        self.failures: list[str] = []
        self.query: Any = None

    def start(self) -> None:
        frame = (self.spark.readStream.format("npstream").option("broker", self.address)
                 .option("stream", ",".join(self.streams))
                 .option("startingOffsets", "earliest").load())
        self.query = (frame.select("id", "key", "value").writeStream.format("npstream")
                      .option("broker", self.address).option("stream", SPARK_STREAM)
                      .option("checkpointLocation", self.checkpoint)
                      .trigger(processingTime="1 second").start())

    def check(self) -> None:
        """Restart the query if it failed (noted with its error)."""
        if self.query is not None and not self.query.isActive:
            error = self.query.exception()
            self.failures.append(str(error)[:2000])
            log.warning("the soak's Spark query failed, restarting it: %s", str(error)[:2000])
            self.restarts += 1
            self.start()

    def caught_up(self, client: Client) -> bool:
        """Whether the target holds as many messages as the sources (after the load)."""
        self.check()
        total = sum(client.stream_info(s).end_offset for s in self.streams)
        return client.stream_info(SPARK_STREAM).end_offset >= total and not self.active_batch()

    def active_batch(self) -> bool:
        status = self.query.status if self.query is not None else {}
        return bool(status.get("isTriggerActive"))

    def stop(self) -> int:
        """Stop the query; the number of micro-batches its checkpoint has run."""
        if self.query is None:
            return 0
        last = self.query.lastProgress  # recentProgress keeps only the last 100
        self.query.stop()
        return 0 if last is None else int(last["batchId"]) + 1


def _wait_for(what: str, done: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.2)
    log.error("soak: %s not reached within %.0fs", what, timeout)
    return False


def run_soak(config: SoakConfig) -> SoakResult:
    """Run the soak of ``config``; the account (see the module docstring)."""
    broker = BrokerProcess(config.work_dir / "data").start()
    result = SoakResult(streams=config.streams)
    soak = _Soak(config, broker.address)
    spark_copy: _SparkCopy | None = None
    push: Any = None
    push_client: Any = None
    try:
        with Client(broker.address, retry_deadline=RETRY_S) as client:
            for stream in soak.streams:
                client.create_stream(stream, max_bytes=0, max_age=0)
            client.create_stream(SINK_STREAM, dedup_window=0, max_bytes=0, max_age=0)
            client.create_stream(SPARK_STREAM, dedup_window=0, max_bytes=0, max_age=0)
        push_client = Client(broker.address, retry_deadline=RETRY_S)  # lives as long as push
        push = push_client.subscribe(soak.shared_stream, "push", soak.push_handler,
                                     ack_wait=ACK_WAIT_S, member_id="push")
        if config.spark is not None:
            spark_copy = _SparkCopy(config.spark, broker.address, soak.streams,
                                    config.work_dir / "spark-checkpoint")
            spark_copy.start()
        workers = [threading.Thread(target=soak.publisher, args=(n,), daemon=True)
                   for n in range(config.publishers)]
        workers.append(threading.Thread(target=soak.cursor_consumer, daemon=True))
        workers += [threading.Thread(target=soak.shared_consumer, args=(f"m{n}",), daemon=True)
                    for n in range(2)]
        workers.append(threading.Thread(target=soak.sink_writer, daemon=True))
        started = time.monotonic()
        for worker in workers:
            worker.start()
        rng = random.Random(config.seed)

        def more_kills() -> bool:
            if config.kills > 0:
                return result.restarts < config.kills
            return time.monotonic() - started < config.seconds

        try:
            while more_kills():
                pause_until = time.monotonic() + rng.uniform(*config.kill_every)
                since = soak.load_mark()
                give_up = time.monotonic() + LOAD_WAIT_S
                while time.monotonic() < pause_until or (
                        config.kills > 0 and not soak.loaded_since(since, config.load_between)):
                    result.peak_rss = max(result.peak_rss, rss(broker.pid))
                    if spark_copy is not None:
                        spark_copy.check()
                    if time.monotonic() > give_up:
                        soak.ledger.violation(
                            f"no load reached the broker within {LOAD_WAIT_S:.0f}s after "
                            f"restart {result.restarts}")
                        break
                    time.sleep(0.05)
                broker.kill()  # SIGKILL at a random moment of the load
                broker.start()
                result.restarts += 1
        finally:
            soak.stop.set()
            for worker in workers:
                worker.join(timeout=120)
        result.seconds = time.monotonic() - started
        hung = [w.name for w in workers if w.is_alive()]
        if hung:
            soak.ledger.violation(f"worker thread(s) hung: {hung}")
        _account(config, broker, soak, push, spark_copy, result)
    finally:
        if push is not None:
            push.stop()
            push_client.close()
        if spark_copy is not None and spark_copy.query is not None and spark_copy.query.isActive:
            spark_copy.query.stop()
        broker.kill()
    return result


def _account(config: SoakConfig, broker: BrokerProcess, soak: _Soak, push: Any,
             spark_copy: _SparkCopy | None, result: SoakResult) -> None:
    """After the load: catch the consumers up, stop cleanly, check files and every count."""
    ledger = soak.ledger
    with Client(broker.address, retry_deadline=RETRY_S) as client:
        shared_end = client.stream_info(soak.shared_stream).end_offset
        # The shared group drains (a pull member), the push member handles everything.
        drain_stop = threading.Event()
        drain = threading.Thread(target=soak.shared_consumer, args=("drain", drain_stop))
        drain.start()
        _wait_for("the shared group at the end", lambda: ledger.shared_position >= shared_end,
                  CATCH_UP_S)
        drain_stop.set()
        drain.join()
        _wait_for("the push subscription at the end",
                  lambda: len(ledger.push_offsets) >= shared_end, CATCH_UP_S)
        if push.error is not None or not push.running:
            result.push_error = repr(push.error)
        push.stop()
        if spark_copy is not None:
            _wait_for("the Spark copy at the end", lambda: spark_copy.caught_up(client),
                      CATCH_UP_S)
            result.spark_batches = spark_copy.stop()
            result.spark_restarts = spark_copy.restarts
            soak.ledger.violations += [f"Spark query failed: {f}" for f in spark_copy.failures]
    if broker.stop() != 0:
        ledger.violation("the broker did not stop cleanly")
    check_files(broker.data_dir)  # every frame's CRC, contiguous offsets
    broker.start()
    with Client(broker.address, retry_deadline=RETRY_S) as client:
        check_streams(client)
        every_id: Counter[str] = Counter()
        for stream in soak.streams:
            stored_table = read_back(client, stream)
            stored = Counter(stored_table.column("id").to_pylist())
            every_id.update(stored)
            acked = ledger.acked_ids[stream]
            result.acked += len(acked)
            result.lost += sum(1 for i in acked if stored[i] == 0)
            result.duplicated += sum(count - 1 for count in stored.values() if count > 1)
            result.bad_checksums += sum(not checksum_ok(v)
                                        for v in stored_table.column("value").to_pylist())
        result.cursor_position = client.consumer(soak.cursor_stream, "cursor").position
        result.shared_stored = next(g.committed_offset for g in client.list_groups(
            soak.shared_stream) if g.group == "shared")
        sink_table = read_back(client, SINK_STREAM)
        last_batch = client.sink().last_batch_id("soak")
        expected_sink = Counter(f"sink-{b}-{i}" for b in range(last_batch + 1)
                                for i in range(SINK_ROWS))
        result.sink_exact = (bool(ledger.sink_batches) and last_batch == ledger.sink_batches[-1]
                             and Counter(sink_table.column("id").to_pylist()) == expected_sink)
        result.bad_checksums += sum(not checksum_ok(v)
                                    for v in sink_table.column("value").to_pylist())
        if spark_copy is not None:
            copied = Counter(read_back(client, SPARK_STREAM).column("id").to_pylist())
            result.spark_rows = sum(copied.values())
            result.spark_lost = sum(1 for i in every_id if copied[i] == 0)
            result.spark_duplicated = sum(n - 1 for n in copied.values() if n > 1)
            result.spark_duplicated += sum(1 for i in copied if i not in every_id)
    if broker.stop() != 0:
        ledger.violation("the broker did not stop cleanly after the checks")
    result.cursor_committed = ledger.cursor_committed
    result.cursor_pulled = ledger.cursor_pulled
    result.shared_acked = len(ledger.shared_acked)
    result.shared_redelivered = ledger.shared_redelivered
    result.shared_position = ledger.shared_position
    result.shared_end = shared_end
    result.push_handled = ledger.push_handled
    result.push_missing = sum(1 for o in range(shared_end) if o not in ledger.push_offsets)
    result.sink_batches = len(ledger.sink_batches)
    result.client_errors = ledger.errors
    result.violations = list(ledger.violations)

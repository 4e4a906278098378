"""Spark exactly-once chaos (issue 18): the driver and the broker killed with SIGKILL at random.

A driver process (``chaos_jobs.py``: its own local[2] SparkSession) runs two
streaming queries from stream A: a copy into B and tumbling-window counts with
a watermark into C, both through the exactly-once sink. While they run, the
test alternates two kinds of kill at seeded random moments after a micro-batch
commit:

* **broker**: kill -9 of the broker process, a short outage, a restart on the
  same port and data dir. The driver must ride it out: the client retries
  UNAVAILABLE with backoff, so the queries go on without restarting (a driver
  that exits fails the test);
* **driver**: kill -9 of the whole driver process group (Python driver, JVM,
  Python workers), then a new driver from the same checkpoints.

``NPSTREAM_CHAOS_KILLS`` (default 1: about 2 minutes on a loaded 2-core machine) kills of
each kind; the issue's long run is 10. After the last kill the driver drains A;
then B and C must be exactly what one clean run makes of A (run in-process on
the session's SparkSession into B0 and C0, on fresh checkpoints): B the same
ids, keys and values in the same order at the same offsets, C the same windows
and counts, each once. C is also checked against the counts computed from A
without Spark.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from integrity import check_files, read_back

from chaos_jobs import expected_windows, source_rows, start_queries, window_rows
from harness import SUPPORT_DIR, BrokerProcess
from npstream import Client
from npstream.sink.client import SinkClient
from npstream.spark.checkpoint import checkpoint_query_id, query_sink_id

pytestmark = [pytest.mark.spark, pytest.mark.slow]

log = logging.getLogger(__name__)

KILLS = int(os.environ.get("NPSTREAM_CHAOS_KILLS", "1"))
SEED = int(os.environ.get("NPSTREAM_CHAOS_SEED", "18"))
PER_BATCH = 150
# Enough micro-batches that every kill lands before the end: each kill waits for
# one commit of either query, and a restarted driver may replay one batch. (The
# long run with 2 * KILLS + 4 batches had copied all of A by the 15th of 20
# kills; it takes about 1.3 batches of the copy per kill.)
TOTAL = PER_BATCH * (3 * KILLS + 4)
JOB = SUPPORT_DIR / "chaos_jobs.py"
PROGRESS_TIMEOUT_S = 240.0
# A Spark-internal race, seen only with the two queries in one driver: planning the
# windowed query's watermark node fails with "Task not serializable" caused by
# "IllegalStateException: Illegal size N of collection, expected N+1" (a collection
# changed while Spark serialized the task). The query ends; an operator restarts the
# driver from its checkpoints, which is exactly-once like any restart, and so does
# this test (at most SPARK_RACE_RESTARTS times, each reported).
SPARK_RACE = "Illegal size"
SPARK_RACE_RESTARTS = 3


class Driver:
    """The chaos driver process (a new session, so its whole group can be killed)."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.args, self.log_path = args, log_path
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0
        self.race_restarts = 0
        self._log_start = 0  # where this run's part of the log begins

    def start(self) -> None:
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable}
        with open(self.log_path, "a") as stderr:
            self.proc = subprocess.Popen([sys.executable, str(JOB), *self.args],
                                         stdout=subprocess.PIPE, stderr=stderr, text=True,
                                         env=env, start_new_session=True)
        self.starts += 1
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "STARTED":
            self.kill()
            raise AssertionError(f"chaos driver printed {line!r}:\n{self.tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 of the driver's process group: the Python driver, its JVM and workers."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):  # also a JVM left by an exited driver
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            # Workers reparented away from the group die with their JVM's pipes; the
            # group kill above reached them too, as they keep the session.
            if self.proc.stdout is not None:
                self.proc.stdout.close()

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def restarted_after_spark_race(self) -> bool:
        """If this run ended on Spark's race (SPARK_RACE), start it again and say so."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start)
            this_run = f.read().decode(errors="replace")
        if SPARK_RACE not in this_run or self.race_restarts >= SPARK_RACE_RESTARTS:
            return False
        self.race_restarts += 1
        log.warning("chaos driver ended on Spark's task-serialization race; restarting it "
                    "from its checkpoints (%d)", self.race_restarts)
        self.kill()
        self.start()
        return True


def wait_until(what: str, done: Callable[[], bool], driver: Driver) -> None:
    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    while not done():
        if not driver.alive() and not driver.restarted_after_spark_race():
            raise AssertionError(f"the chaos driver exited while waiting for {what} "
                                 f"(exit {driver.proc.returncode if driver.proc else None}):\n"
                                 f"{driver.tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {PROGRESS_TIMEOUT_S:.0f}s:\n{driver.tail()}")
        time.sleep(0.05)


def default_sink_id(checkpoint: str) -> str | None:
    """The sink id of the query with this checkpoint; None before the query first started."""
    query_id = checkpoint_query_id(checkpoint)
    return query_sink_id(query_id) if query_id else None


def batches(sink: SinkClient, checkpoints: tuple[str, str]) -> int:
    sink_ids = [default_sink_id(checkpoint) for checkpoint in checkpoints]
    return sum(sink.last_batch_id(sink_id) if sink_id else -1 for sink_id in sink_ids)


def stream_rows(client: Client, stream: str) -> int:
    try:
        return client.stream_info(stream).end_offset
    except LookupError:
        return 0


@pytest.mark.timeout(600 + 240 * KILLS)
def test_copy_and_windows_exactly_once_through_driver_and_broker_kills(spark, tmp_path: Path,
                                                                        ) -> None:
    broker = BrokerProcess(tmp_path / "data").start()
    checkpoints = (str(tmp_path / "checkpoint-b"), str(tmp_path / "checkpoint-c"))
    driver = Driver([broker.address, "A", "B", "C", *checkpoints, str(PER_BATCH), "run"],
                    tmp_path / "driver.log")
    rng = random.Random(SEED)
    expected = expected_windows(TOTAL)
    kills = {"broker": 0, "driver": 0}
    started = time.monotonic()
    try:
        with Client(broker.address, retry_deadline=60) as client:
            client.publish_batch("A", source_rows(TOTAL))
            sink = client.sink()
            driver.start()
            # broker, driver, broker, driver, ...: each kill at a random moment after a
            # commit of either query (0-2 s later: before, during or after the next batch).
            for kind in ["broker", "driver"] * KILLS:
                before = batches(sink, checkpoints)
                wait_until("a micro-batch commit", lambda b=before: batches(sink, checkpoints) > b,
                           driver)
                time.sleep(rng.uniform(0.0, 2.0))
                if kind == "broker":
                    broker.kill()
                    time.sleep(rng.uniform(0.0, 1.5))  # an outage of up to 1.5 s
                    broker.start()
                else:
                    driver.kill()
                    driver.start()
                kills[kind] += 1
                log.info("chaos kill %d: %s at batches %s, B %d rows", sum(kills.values()),
                         kind, before, stream_rows(client, "B"))
            # The last driver drains A (the sentinel's batch, then a batch without data that
            # emits the windows the watermark closed).
            wait_until("the whole of A copied to B and every window in C",
                       lambda: stream_rows(client, "B") >= TOTAL + 1
                       and stream_rows(client, "C") >= len(expected), driver)
            time.sleep(2.0)  # any stray extra batch would show up now, and fail below
            driver.kill()
            chaos_seconds = time.monotonic() - started

            # One clean run of the same queries, in-process, from the start of A (again
            # from its checkpoints if it meets Spark's race, as the driver does).
            for attempt in range(SPARK_RACE_RESTARTS + 1):
                clean = start_queries(spark, broker.address, "A", "B0", "C0",
                                      (str(tmp_path / "clean-b"), str(tmp_path / "clean-c")),
                                      TOTAL + 1, "finish")
                for query in clean:
                    query.awaitTermination(300)
                errors = [str(q.exception()) for q in clean if q.exception() is not None]
                if not errors:
                    break
                assert attempt < SPARK_RACE_RESTARTS and all(SPARK_RACE in e for e in errors), (
                    errors)
                for query in clean:
                    query.stop()

            copy, copy_clean = read_back(client, "B"), read_back(client, "B0")
            for column in ("offset", "id", "key", "value"):
                assert copy.column(column).to_pylist() == copy_clean.column(column).to_pylist(), (
                    f"B's {column} differs from the clean run's (kills {kills})")
            assert copy.column("id").to_pylist() == [f"a-{i}" for i in range(TOTAL)] + ["a-end"]
            windows = window_rows(read_back(client, "C").column("value").to_pylist())
            windows_clean = window_rows(read_back(client, "C0").column("value").to_pylist())
            assert windows == windows_clean, (
                f"C differs from the clean run: extra {windows - windows_clean}, "
                f"missing {windows_clean - windows}")
            assert windows == expected
            sink_ids = [default_sink_id(checkpoint) for checkpoint in checkpoints]
            for sink_id, checkpoint in zip(sink_ids, checkpoints, strict=True):
                assert sink_id is not None
                spark_commits = [int(p.name) for p in (Path(checkpoint) / "commits").iterdir()
                                 if p.name.isdigit()]
                assert sink.last_batch_id(sink_id) == max(spark_commits)
        assert kills == {"broker": KILLS, "driver": KILLS}
        assert driver.starts == KILLS + 1 + driver.race_restarts, (
            "a driver exited on its own (see its log)")
        print(f"spark chaos: {kills['driver']} driver kill -9, {kills['broker']} broker "
              f"kill -9, {TOTAL + 1} rows copied once, {sum(expected.values())} windows once, "
              f"{chaos_seconds:.0f}s, {driver.race_restarts} restart(s) after Spark's race")
        assert broker.stop() == 0
        check_files(broker.data_dir)
        for sink_id in sink_ids:
            assert sink_id is not None
            assert not list((broker.data_dir / "sink" / sink_id).rglob("*.arrow")), sink_id
    finally:
        driver.kill()
        broker.kill()

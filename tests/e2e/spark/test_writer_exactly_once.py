"""Exactly-once across driver crashes: copy A -> B while the Spark driver is killed -9 at random.

The copy runs as its own process (own local[2] SparkSession, fixed
checkpointLocation), like a production job; the test kills the whole process
group (driver JVM, Python workers) at seeded random moments, restarts it, and
finally lets it finish with Trigger.AvailableNow. B must then hold exactly A's
messages: same ids, same order, none lost, none twice.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from quick_jvm import quick_jvm_env

from npstream import Client
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.sink.client import SinkClient
from npstream.spark.checkpoint import checkpoint_query_id, query_sink_id

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PER_BATCH = 300
KILLS = 3
# A run copies at most a batch a second (the trigger), so the runs before the kills (a
# commit each, then 0, 2.9 and 1.5 s: the seeded delays) copy at most ~11 batches: every
# kill lands before the end.
TOTAL = PER_BATCH * 12
SEED = 20261122

COPY_JOB = '''
import sys
from pyspark.sql import SparkSession

broker, source, target, checkpoint, mode = sys.argv[1:6]
spark = (SparkSession.builder.master("local[2]").appName("npstream-exactly-once-copy")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
from npstream.spark import register
register(spark)
reader = (spark.readStream.format("npstream").option("broker", broker).option("stream", source)
          .option("startingOffsets", "earliest"))
if mode != "finish":  # small batches while the kills come; the rest in one (each costs ~2 s)
    reader = reader.option("maxOffsetsPerTrigger", "PER_BATCH")
frame = reader.load()
writer = (frame.writeStream.format("npstream").option("broker", broker).option("stream", target)
          .option("checkpointLocation", checkpoint))
if mode == "finish":
    writer = writer.trigger(availableNow=True)
else:  # at most a batch a second, so the kills land before everything is copied
    writer = writer.trigger(processingTime="1 second")
query = writer.start()
print("STARTED", flush=True)
query.awaitTermination()
print("FINISHED", flush=True)
'''.replace("PER_BATCH", str(PER_BATCH))


def read(client: Client, stream: str) -> pa.Table:
    info = client.stream_info(stream)
    return pa.Table.from_batches(list(client.read_range(stream, info.start_offset,
                                                        info.end_offset)),
                                 schema=MESSAGE_SCHEMA)


def copied(client: Client, stream: str) -> int:
    try:
        return client.stream_info(stream).end_offset
    except LookupError:
        return 0


def start_job(script: Path, args: list[str], log: Path) -> subprocess.Popen[str]:
    # the quick JVM options: each start ~10 s instead of ~20 s under load (quick_jvm.py)
    env = {**quick_jvm_env(), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    with open(log, "a") as stderr:
        return subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE,
                                stderr=stderr, text=True, env=env, start_new_session=True)


def wait_for_line(proc: subprocess.Popen[str], expected: str, log: Path) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != expected:
        proc.wait(30)
        raise AssertionError(f"copy job printed {line!r} (exit {proc.returncode}):\n"
                             f"{log.read_text()[-4000:]}")


def wait_for_commit(sink: SinkClient, sink_id: str, last: int,
                    job: subprocess.Popen[str], log: Path) -> None:
    """Return as soon as the broker records a batch after ``last`` for this sink."""
    deadline = time.monotonic() + 180
    while sink.last_batch_id(sink_id) == last:
        if job.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"copy job made no progress (exit {job.returncode}):\n"
                                 f"{log.read_text()[-4000:]}")
        time.sleep(0.02)


def test_copy_with_driver_killed_at_random_points_is_exactly_once(broker, stream_name,
                                                                   tmp_path):
    source, target = f"{stream_name}-a", f"{stream_name}-b"
    script, log = tmp_path / "copy_job.py", tmp_path / "copy_job.log"
    script.write_text(COPY_JOB)
    checkpoint = tmp_path / "checkpoint"
    args = [broker.address, source, target, str(checkpoint)]
    rng = random.Random(SEED)
    with Client(broker.address) as client:
        client.publish_batch(source, [{"value": f"value-{i}".encode(), "id": f"a-{i}"}
                                      for i in range(TOTAL)])
        sink = client.sink()
        sink_id = ""  # the query's id, in its checkpoint once it first started
        # The first kill lands right after the broker committed a batch (likely before
        # Spark's commit log has it: the replay case), the others at random moments.
        delays = [0.0] + [rng.uniform(0.0, 3.0) for _ in range(KILLS - 1)]
        progress: list[int] = []
        last_batch = TOTAL // PER_BATCH - 1
        for delay in delays:
            if sink_id and sink.last_batch_id(sink_id) >= last_batch:
                break  # a fast machine copied everything already; nothing left to interrupt
            job = start_job(script, [*args, "run"], log)
            wait_for_line(job, "STARTED", log)
            sink_id = query_sink_id(str(checkpoint_query_id(str(checkpoint))))
            wait_for_commit(sink, sink_id, sink.last_batch_id(sink_id), job, log)
            time.sleep(delay)
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
            progress.append(copied(client, target))

        final = start_job(script, [*args, "finish"], log)
        wait_for_line(final, "STARTED", log)
        wait_for_line(final, "FINISHED", log)
        assert final.wait(60) == 0

        result = read(client, target)
        ids = result.column("id").to_pylist()
        assert len(ids) == TOTAL, f"{len(ids) - len(set(ids))} duplicate(s), progress {progress}"
        assert ids == [f"a-{i}" for i in range(TOTAL)]
        assert result.column("value").to_pylist() == [f"value-{i}".encode()
                                                      for i in range(TOTAL)]
        assert len(progress) == KILLS and all(0 < count < TOTAL for count in progress), progress
        spark_commits = [int(p.name) for p in (checkpoint / "commits").iterdir()
                         if p.name.isdigit()]
        assert sink.last_batch_id(sink_id) == max(spark_commits)
    leftover = Path(broker.data_dir) / "sink" / sink_id
    assert not list(leftover.rglob("*.arrow"))

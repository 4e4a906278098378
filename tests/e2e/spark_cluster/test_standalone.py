"""npstream on a Spark standalone cluster: jobs submitted with spark-submit --master spark://.

The driver is the spark-submit process, in a scratch directory; tasks run in
executors of two Workers, each in its own JVM, Python workers and working
directory (conftest.py). So a task has only what its partition or the pickled
reader/writer carries, and the driver only what the tasks' commit messages
say.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from harness import SUPPORT_DIR, BrokerProcess
from npstream import Client
from npstream.proto.host_identity import HOST_ID_ENV
from npstream.proto.schema import MESSAGE_SCHEMA
from sensor_events import (
    EVENTS,
    EXPECTED,
    READING_SCHEMA,
    SENSOR_PIPELINE,
    WebhookReceiver,
    check_windows,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

COPY_JOB = SUPPORT_DIR / "copy_job.py"
LOCATED = "npstream_located_messages_total"
FETCHED = "npstream_fetched_messages_total"
BY_FILE = "npstream_sink_inbox_stages_total"
REPLAYED = "npstream_sink_replayed_commits_total"


def test_sensor_pipeline_submitted_to_the_cluster_gives_the_exact_windows(
        standalone_cluster, broker: BrokerProcess, client: Client, stream_name: str,
        tmp_path: Path) -> None:
    client.create_stream(stream_name, schema=READING_SCHEMA)
    client.publish_batch(stream_name, [{"value": r} for r in EVENTS])
    results_stream = f"{stream_name}-results"
    receiver = WebhookReceiver().start()
    try:
        standalone_cluster.submit(
            SENSOR_PIPELINE / "pipeline.py", "--broker", broker.address,
            "--source-stream", stream_name, "--results-stream", results_stream,
            "--output-dir", str(tmp_path / "out"), "--webhook-url", receiver.url,
            "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--max-offsets-per-trigger", "6", "--available-now", "--quiet")
    finally:
        receiver.stop()

    # JSON files written by the executors, records staged by them and committed
    # by the driver from their commit messages, the webhook posted by the driver.
    check_windows(tmp_path / "out", client, results_stream)
    posted = [w for payload in receiver.received for w in payload["windows"]]
    assert len(posted) == len(EXPECTED)


def _metrics(broker: BrokerProcess) -> dict[str, float]:
    sample = broker.metrics()
    return {name: sample.get(name, 0.0) for name in (LOCATED, FETCHED, BY_FILE, REPLAYED)}


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in after}


def _stored(client: Client, stream: str) -> pa.Table:
    end = client.stream_info(stream).end_offset
    return pa.Table.from_batches(list(client.read_range(stream, 0, end)), schema=MESSAGE_SCHEMA)


def _publish(client: Client, stream: str, numbers: range) -> None:
    client.publish_batch(stream, [{"value": f"v{i}".encode(), "id": f"id-{i}", "key": f"k{i % 3}"}
                                  for i in numbers])


def test_copy_survives_a_replayed_batch_and_off_host_executors_use_grpc(
        standalone_cluster, broker: BrokerProcess, client: Client, stream_name: str,
        tmp_path: Path) -> None:
    """Exactly once across a replayed micro-batch, the second run on executors "elsewhere".

    Run 1 copies 60 messages in three batches (0, 1, 2) with executors on the
    broker's host: they read the segment files and stage through the inbox.
    Then the checkpoint forgets that batch 2 was committed (its commits/2 file
    is deleted, as when the driver dies between the sink's commit and Spark's),
    so run 2 replays batch 2 and then copies 20 new messages as batch 3. Run 2's
    executors have another host identity ($NPSTREAM_HOST_ID): they must read
    and stage over gRPC. The broker recognises the replayed batch from the sink
    id alone (no driver memory survives between the two spark-submits): the
    target holds every message once, in order.
    """
    source, target = f"{stream_name}-src", f"{stream_name}-dst"
    checkpoint = tmp_path / "checkpoint"
    _publish(client, source, range(60))

    before = _metrics(broker)
    standalone_cluster.submit(COPY_JOB, broker.address, source, target, str(checkpoint),
                              str(tmp_path / "run1.json"))
    run1 = json.loads((tmp_path / "run1.json").read_text())
    on_host = _delta(before, _metrics(broker))
    assert run1["exception"] is None
    assert [b for b, rows in zip(run1["batches"], run1["rows"], strict=True) if rows] == [0, 1, 2]
    assert on_host[FETCHED] == 0 and on_host[LOCATED] >= 60, on_host  # segment files
    assert on_host[BY_FILE] >= 3, on_host  # one inbox file per task with rows, at least
    assert _stored(client, target).column("id").to_pylist() == [f"id-{i}" for i in range(60)]

    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
    _publish(client, source, range(60, 80))

    before = _metrics(broker)
    standalone_cluster.submit(COPY_JOB, broker.address, source, target, str(checkpoint),
                              str(tmp_path / "run2.json"),
                              conf={f"spark.executorEnv.{HOST_ID_ENV}": "another-host"})
    run2 = json.loads((tmp_path / "run2.json").read_text())
    off_host = _delta(before, _metrics(broker))
    assert run2["exception"] is None
    assert [b for b, rows in zip(run2["batches"], run2["rows"], strict=True) if rows] == [2, 3]
    assert off_host[FETCHED] == 40, off_host  # batch 2 read again, batch 3: over gRPC
    assert off_host[BY_FILE] == 0, off_host   # staged over gRPC
    assert off_host[REPLAYED] == 1, off_host  # batch 2's commit appended nothing

    copied = _stored(client, target)
    assert copied.column("offset").to_pylist() == list(range(80))
    assert copied.column("id").to_pylist() == [f"id-{i}" for i in range(80)]
    assert copied.column("value").to_pylist() == [f"v{i}".encode() for i in range(80)]
    assert copied.column("key").to_pylist() == [f"k{i % 3}".encode() for i in range(80)]

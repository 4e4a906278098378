"""The sensor pipeline's windows, checked exactly on a fixed event set with invalid and late events.

The events and the windows they must give are in sensor_events.py (shared with
the run on a standalone cluster, tests/e2e/spark_cluster/test_standalone.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import BrokerProcess
from npstream.errors import ValueMismatch
from sensor_events import (
    EVENTS,
    EXPECTED,
    READING_SCHEMA,
    WebhookReceiver,
    check_windows,
    pipeline,
    reading,
)

pytestmark = [pytest.mark.spark]


def test_tumbling_windows_exact_with_invalid_and_late_events(
    spark, client, broker: BrokerProcess, stream_name: str, tmp_path: Path
) -> None:
    client.create_stream(stream_name, schema=READING_SCHEMA)
    with pytest.raises(ValueMismatch, match=r"message 0: field 'value' .*expected DOUBLE"):
        client.publish(stream_name, reading("s2", 4, "n/a"))  # refused by the schema
    client.publish_batch(stream_name, [{"value": r} for r in EVENTS])
    receiver = WebhookReceiver().start()
    results_stream = f"{stream_name}-results"
    args = pipeline.parse_args([
        "--broker", broker.address, "--source-stream", stream_name,
        "--results-stream", results_stream, "--output-dir", str(tmp_path / "out"),
        "--webhook-url", receiver.url, "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--max-offsets-per-trigger", "6", "--available-now", "--quiet",
    ])
    try:
        pipeline.run(spark, args)
    finally:
        receiver.stop()

    check_windows(tmp_path / "out", client, results_stream)
    posted = [w for payload in receiver.received for w in payload["windows"]]
    assert len(posted) == len(EXPECTED)

"""The sensor pipeline's live metrics (tutorial JSON and Prometheus text) on a known event set.

Three micro-batches of 4 readings (maxOffsetsPerTrigger=4): 2 readings are
invalid (no value; a wrong unit), so of 12 received 10 pass the filter
(processed, as the tutorial counts) and 2 are dropped; 1 more comes after
the watermark and does not reach a window (Spark may or may not report it as
dropped: it counts late rows after the partial aggregation). Windows close
once the watermark passes them: 5 windows, the one at 60 s stays open, and
the last ones only in the final no-data batch, whose progress Spark reports
after the query stopped. The first two batches left readings for later
(latestOffset 12 past their end): 2 backpressure events.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from harness import REPO_ROOT, BrokerProcess

sys.path.insert(0, str(REPO_ROOT / "examples" / "sensor_pipeline"))

import live_metrics
import pipeline
import producer

pytestmark = [pytest.mark.spark]

T0 = 1_700_000_000_000  # a multiple of 5 s


def reading(sensor: str, at_s: float, value: float | None, unit: str = "celsius") -> dict:
    r: dict = {"sensorId": sensor, "ts": datetime.fromtimestamp(T0 / 1000 + at_s, UTC),
               "unit": unit}
    if value is not None:
        r["value"] = value
    return r


READINGS = [
    # batch 1: max event time 6 s
    reading("s1", 1, 10.0), reading("s1", 2, 90.0), reading("s2", 3, None), reading("s1", 6, 20.0),
    # batch 2: a wrong unit; max event time 22 s, so the watermark becomes 12 s
    reading("s1", 12, 30.0), reading("s2", 13, 70.0, "fahrenheit?"), reading("s2", 14, 40.0),
    reading("s1", 22, 60.0),
    # batch 3: 4 s is behind the watermark (dropped), 14 s is not; 60+ s moves it to 52 s
    reading("s1", 4, 99.0), reading("s1", 14, 44.0), reading("s3", 60, 1.0), reading("s3", 62, 3.0),
]


def test_live_metrics_count_the_tutorials_numbers(spark, client, broker: BrokerProcess,
                                                  stream_name: str, tmp_path: Path):
    client.create_stream(stream_name, schema=producer.READING_SCHEMA)
    client.publish_batch(stream_name, [{"value": r} for r in READINGS])
    metrics = live_metrics.LiveMetrics()
    url = metrics.serve(port=0)
    args = pipeline.parse_args([
        "--broker", broker.address, "--source-stream", stream_name, "--results-stream", "",
        "--output-dir", str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--max-offsets-per-trigger", "4", "--available-now", "--quiet",
    ])
    try:
        pipeline.run(spark, args, metrics=metrics)
        served = json.loads(urllib.request.urlopen(url, timeout=10).read())
        text = urllib.request.urlopen(url + "/prometheus", timeout=10).read().decode()
    finally:
        metrics.stop()

    counts = {k: served[k] for k in ("eventsReceived", "eventsProcessed", "eventsDropped",
                                     "windowsEmitted", "backpressureEvents")}
    late = counts.pop("eventsDropped") - 2
    assert late in (0, 1)
    assert counts == {"eventsReceived": 12, "eventsProcessed": 10, "windowsEmitted": 5,
                      "backpressureEvents": 2}
    counts["eventsDropped"] = 2 + late
    assert set(served) == {*counts, "uptimeMs", "eventsPerSecond"}  # the tutorial's shape
    assert served["uptimeMs"] > 0
    assert served["eventsPerSecond"] == pytest.approx(10 / (served["uptimeMs"] / 1000), rel=0.2)
    samples = dict(line.split(" ") for line in text.splitlines() if not line.startswith("#"))
    assert samples["sensor_events_received_total"] == "12"
    assert samples["sensor_events_processed_total"] == "10"
    assert samples["sensor_events_dropped_total"] == str(2 + late)
    assert samples["sensor_windows_emitted_total"] == "5"
    assert samples["sensor_backpressure_events_total"] == "2"
    assert "# TYPE sensor_uptime_seconds gauge" in text
    windows = [json.loads(line) for f in (tmp_path / "out" / "tumbling").glob("*.json")
               for line in f.read_text().splitlines()]
    assert len(windows) == 5  # what the sinks got is what was counted
    assert "Rate:" in metrics.report() and " Windows: 5" in metrics.report()

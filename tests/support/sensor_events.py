"""The sensor pipeline's fixed event set and the windows it must give, exactly.

Shared by the local run (test_sensor_pipeline.py) and the run submitted to a
standalone cluster (tests/e2e/spark_cluster/test_standalone.py).

Three micro-batches are forced with maxOffsetsPerTrigger=6. Spark drops a
late row when its event time is behind the watermark of the *previous*
batch, so the too-late readings (4 s and 9 s) come in the third batch, when
that watermark is 23 s - 10 s = 13 s; readings at 14 s are late but inside it
and are counted. Readings at 60+ s move the watermark to 53 s so every earlier
window closes in the final no-data batch.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from harness import REPO_ROOT

SENSOR_PIPELINE = REPO_ROOT / "examples" / "sensor_pipeline"
sys.path.insert(0, str(SENSOR_PIPELINE))

# The example's modules, importable from here on (and re-exported for the tests).
import pipeline  # noqa: E402
from producer import READING_SCHEMA  # noqa: E402
from webhook import WebhookReceiver  # noqa: E402

__all__ = ["EVENTS", "EXPECTED", "READING_SCHEMA", "SENSOR_PIPELINE", "T0", "WebhookReceiver",
           "check_windows", "pipeline", "reading"]

T0 = 1_700_000_000_000  # a multiple of 5 s


def reading(sensor: str, at_s: float, value: object, unit: str = "celsius") -> dict:
    r = {"sensorId": sensor, "ts": datetime.fromtimestamp(T0 / 1000 + at_s, UTC), "unit": unit}
    if value is not None:
        r["value"] = value
    return r


BATCH_1 = [  # offsets 0-5: max event time 21 s, so the watermark becomes 11 s
    reading("s1", 1, 10.0), reading("s1", 2, 90.0), reading("s2", 3, 50.0),
    reading("s1", 6, 20.0), reading("s2", 4, None, unit=""), reading("s2", 21, 85.0),
]
BATCH_2 = [  # offsets 6-11: 14 s is late but inside the watermark; max 23 s -> watermark 13 s
    reading("s1", 12, 30.0), reading("s2", 14, 40.0), reading("s1", 13, 70.0, "fahrenheit?"),
    reading("s2", 13.5, None), reading("s1", 22, 60.0), reading("s2", 23, 70.0),
]
BATCH_3 = [  # offsets 12-17: 4 s and 9 s are behind the watermark (dropped), 14 s is not
    reading("s1", 4, 99.0), reading("s2", 9, 55.0), reading("s1", 14, 44.0),
    reading("s3", 60, 1.0), reading("s3", 62, 3.0), reading("s3", 63, 4.0),
]
# Publish these in one batch and run the pipeline with --max-offsets-per-trigger 6.
EVENTS = BATCH_1 + BATCH_2 + BATCH_3


def window(start_s: int, sensor: str, values: list[float]) -> dict:
    return {
        "windowStart": T0 + start_s * 1000, "windowEnd": T0 + (start_s + 5) * 1000,
        "sensorId": sensor, "count": len(values), "sum": sum(values),
        "avg": sum(values) / len(values), "min": min(values), "max": max(values),
        "alertCount": sum(v > 80 for v in values),
    }


EXPECTED = [
    window(0, "s1", [10.0, 90.0]),
    window(0, "s2", [50.0]),
    window(5, "s1", [20.0]),
    window(10, "s1", [30.0, 44.0]),
    window(10, "s2", [40.0]),
    window(20, "s1", [60.0]),
    window(20, "s2", [85.0, 70.0]),
]


def _as_ms(value: str) -> int:
    return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)


def check_windows(output_dir: Path, client: object, results_stream: str) -> None:
    """The pipeline's JSON-lines output and its typed results stream hold exactly EXPECTED."""
    rows = [json.loads(line) for f in sorted((output_dir / "tumbling").glob("*.json"))
            for line in f.read_text().splitlines()]
    got = sorted(
        ({**r, "windowStart": _as_ms(r["windowStart"]), "windowEnd": _as_ms(r["windowEnd"])}
         for r in rows),
        key=lambda r: (r["windowStart"], r["sensorId"]),
    )
    assert [(r["windowStart"], r["sensorId"]) for r in got] == [
        (w["windowStart"], w["sensorId"]) for w in EXPECTED
    ]
    numeric = ["windowEnd", "count", "sum", "avg", "min", "max", "alertCount"]
    for row, want in zip(got, EXPECTED, strict=True):
        assert {k: row[k] for k in numeric} == pytest.approx({k: want[k] for k in numeric})

    results = client.fetch(results_stream, 0).to_pylist()  # type: ignore[attr-defined]
    assert sorted(r["id"] for r in results) == sorted(
        f"{w['sensorId']}@{w['windowStart']}" for w in EXPECTED
    )
    info = client.stream_info(results_stream)  # type: ignore[attr-defined]
    assert info.value_schema_ddl == (
        "windowStart TIMESTAMP, windowEnd TIMESTAMP, sensorId STRING, count BIGINT, "
        "sum DOUBLE, avg DOUBLE, min DOUBLE, max DOUBLE, alertCount BIGINT")
    by_id = {r["id"]: r["value"] for r in results}
    first = by_id[f"s1@{T0}"]
    assert first == {"windowStart": datetime.fromtimestamp(T0 / 1000, UTC),
                     "windowEnd": datetime.fromtimestamp(T0 / 1000 + 5, UTC),
                     "sensorId": "s1", "count": 2, "sum": 100.0, "avg": 50.0, "min": 10.0,
                     "max": 90.0, "alertCount": 1}

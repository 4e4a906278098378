"""How far behind a streaming query is: query progress and the broker's group metrics.

The source reports the broker's end offsets (``reportLatestOffset``), so
``lastProgress`` shows ``latestOffset`` beside each batch's ``endOffset``; a
query with the ``group`` option commits its progress to a cursor group, whose
lag the broker exports like any group's.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from harness import BrokerProcess
from npstream import Client

pytestmark = pytest.mark.spark

QUERY_TIMEOUT_S = 180


def test_last_progress_and_group_metrics_show_how_far_behind(spark, broker: BrokerProcess,
                                                             client: Client, stream_name: str):
    from npstream.spark import register

    register(spark)
    client.publish_batch(stream_name, [{"value": f"v{i}".encode()} for i in range(35)])
    frame = (spark.readStream.format("npstream").option("broker", broker.address)
             .option("stream", stream_name).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "10").option("group", "progress-q").load())
    query = (frame.writeStream.format("memory").queryName(f"q_{uuid.uuid4().hex[:12]}")
             .trigger(availableNow=True).start())
    assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish"

    sources = [p["sources"][0] for p in query.recentProgress if p["numInputRows"]]
    ends = [json.loads(s["endOffset"])[stream_name] for s in sources]
    latest = [json.loads(s["latestOffset"])[stream_name] for s in sources]
    assert ends == [10, 20, 30, 35]
    assert latest == [35, 35, 35, 35]  # the broker's end, not the batch's
    assert [b - e for b, e in zip(latest, ends, strict=True)] == [25, 15, 5, 0]  # behind

    key = f'{{group="progress-q",stream="{stream_name}"}}'
    metrics = broker.metrics()
    assert metrics[f"npstream_group_committed_offset{key}"] == 35
    assert metrics[f"npstream_group_lag_messages{key}"] == 0
    assert metrics[f"npstream_group_lag_seconds{key}"] == 0
    assert client.describe_group(stream_name, "progress-q").kind == "cursor"

    client.publish_batch(stream_name, [{"value": b"late"}] * 5)
    time.sleep(1.1)
    metrics = broker.metrics()
    assert metrics[f"npstream_group_lag_messages{key}"] == 5
    assert metrics[f"npstream_group_lag_seconds{key}"] >= 1.0

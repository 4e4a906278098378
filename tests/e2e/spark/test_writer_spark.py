"""The npstream sink in real local Spark: streaming copies, routing, all-or-nothing batch writes."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from npstream import Client
from npstream.proto.schema import MESSAGE_SCHEMA

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def npstream_spark(spark):
    from npstream.spark import register

    register(spark)
    return spark


def read(client: Client, stream: str) -> pa.Table:
    info = client.stream_info(stream)
    return pa.Table.from_batches(list(client.read_range(stream, info.start_offset,
                                                        info.end_offset)),
                                 schema=MESSAGE_SCHEMA)


def copy_query(spark, broker, source: str, target: str, checkpoint: Path, **read_options: str):
    reader = (spark.readStream.format("npstream").option("broker", broker.address)
              .option("stream", source).option("startingOffsets", "earliest"))
    for key, value in read_options.items():
        reader = reader.option(key, value)
    return (reader.load().writeStream.format("npstream")
            .option("broker", broker.address).option("stream", target)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start())


def test_streaming_copy_writes_every_row_once_and_restart_continues(
        npstream_spark, broker, client, stream_name, tmp_path):
    source, target = f"{stream_name}-a", f"{stream_name}-b"
    client.publish_batch(source, [
        {"value": f"v{i}".encode(), "id": f"id-{i}", "key": f"k{i % 3}",
         "headers": {"h": f"{i}"}} for i in range(500)])
    checkpoint = tmp_path / "checkpoint"

    query = copy_query(npstream_spark, broker, source, target, checkpoint,
                       maxOffsetsPerTrigger="200", includeHeaders="true")
    query.awaitTermination(120)
    assert query.exception() is None
    batches = [p["batchId"] for p in query.recentProgress if p["numInputRows"]]

    client.publish_batch(source, [{"value": f"v{i}".encode(), "id": f"id-{i}"}
                                  for i in range(500, 650)])
    again = copy_query(npstream_spark, broker, source, target, checkpoint,
                       includeHeaders="true")
    again.awaitTermination(120)
    assert again.exception() is None

    copied, original = read(client, target), read(client, source)
    assert batches == [0, 1, 2]
    assert copied.column("id").to_pylist() == [f"id-{i}" for i in range(650)]
    assert copied.column("offset").to_pylist() == list(range(650))
    for column in ("id", "key", "value", "headers"):
        assert copied.column(column).to_pylist() == original.column(column).to_pylist()


def test_streaming_write_routes_rows_by_stream_column(npstream_spark, broker, client,
                                                      stream_name, tmp_path):
    source = f"{stream_name}-src"
    even, odd = f"{stream_name}-even", f"{stream_name}-odd"
    client.publish_batch(source, [{"value": str(i).encode(), "id": f"n{i}"} for i in range(40)])
    frame = (npstream_spark.readStream.format("npstream").option("broker", broker.address)
             .option("stream", source).option("startingOffsets", "earliest").load()
             .selectExpr("id", "value",
                         f"IF(CAST(CAST(value AS STRING) AS INT) % 2 = 0, '{even}', '{odd}') "
                         "AS stream"))
    query = (frame.writeStream.format("npstream").option("broker", broker.address)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start())
    query.awaitTermination(120)
    assert query.exception() is None

    assert read(client, even).column("id").to_pylist() == [f"n{i}" for i in range(0, 40, 2)]
    assert read(client, odd).column("id").to_pylist() == [f"n{i}" for i in range(1, 40, 2)]


def inbox_stages(broker) -> float:
    """Stage requests the broker read from its stage inbox so far (its metrics endpoint)."""
    return broker.metrics().get("npstream_sink_inbox_stages_total", 0.0)


@pytest.mark.parametrize(("local_staging", "by_file"), [("true", 4), ("false", 0)])
def test_batch_write_commits_all_partitions_at_once(npstream_spark, broker, client,
                                                    stream_name, local_staging, by_file):
    before = inbox_stages(broker)
    frame = npstream_spark.range(0, 1000, numPartitions=4).selectExpr(
        "CAST(id AS STRING) AS value", "CONCAT('row-', id) AS id")
    frame.write.format("npstream").option("broker", broker.address) \
        .option("stream", stream_name).option("localStaging", local_staging) \
        .mode("append").save()

    table = read(client, stream_name)
    assert sorted(table.column("id").to_pylist()) == sorted(f"row-{i}" for i in range(1000))
    assert table.column("offset").to_pylist() == list(range(1000))
    # Tasks on the broker's machine hand their rows over in inbox files (one request each).
    assert inbox_stages(broker) - before == by_file


def test_batch_write_with_a_failing_task_makes_nothing_visible(npstream_spark, broker, client,
                                                               stream_name):
    from pyspark.sql.functions import udf

    @udf("string")
    def fail_on_last(value):
        if value == "999":
            raise ValueError("boom at row 999")
        return value

    client.create_stream(stream_name)
    frame = npstream_spark.range(0, 1000, numPartitions=4).selectExpr(
        "CAST(id AS STRING) AS value").select(fail_on_last("value").alias("value"))
    with pytest.raises(Exception, match="boom at row 999"):
        frame.write.format("npstream").option("broker", broker.address) \
            .option("stream", stream_name).mode("append").save()

    assert client.stream_info(stream_name).end_offset == 0
    # Partitions that finished before the failure had staged rows: the abort dropped them.
    assert re.search(r"sink 'batch-[0-9a-f]{32}' batch 0 aborted: [1-9]\d* staging file",
                     broker.log_text())


def test_write_with_unknown_option_fails_naming_it(npstream_spark, broker, stream_name):
    frame = npstream_spark.range(1).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match=r"Unknown option 'sinkid2'"):
        frame.write.format("npstream").option("broker", broker.address) \
            .option("stream", stream_name).option("sinkid2", "x").mode("append").save()


def test_write_without_value_column_fails_at_start(npstream_spark, broker, client,
                                                  stream_name):
    """Without a 'value' column the columns are a typed record: an untyped target refuses
    them at start, naming the columns (typed writes: test_writer_typed.py)."""
    client.create_stream(stream_name)
    frame = npstream_spark.range(1).selectExpr("CAST(id AS STRING) AS payload")
    with pytest.raises(Exception, match=rf"Stream '{stream_name}' is untyped \(binary values\), "
                                        r"but the data is written as a typed stream's record "
                                        r"\(columns: payload STRING NOT NULL\)"):
        frame.write.format("npstream").option("broker", broker.address) \
            .option("stream", stream_name).mode("append").save()
    assert client.stream_info(stream_name).end_offset == 0


def test_streaming_complete_mode_appends_the_whole_result_every_batch(
        npstream_spark, broker, client, stream_name, tmp_path):
    source, target = f"{stream_name}-src", f"{stream_name}-counts"
    client.publish_batch(source, [{"value": b"x", "key": k} for k in "aabbcc"])
    counts = (npstream_spark.readStream.format("npstream").option("broker", broker.address)
              .option("stream", source).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "2").load()
              .groupBy("key").count()
              .selectExpr("CAST(key AS STRING) AS key", "CAST(count AS STRING) AS value"))
    query = (counts.writeStream.outputMode("complete").format("npstream")
             .option("broker", broker.address).option("stream", target)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start())
    query.awaitTermination(120)
    assert query.exception() is None

    table = read(client, target)
    pairs = sorted(zip(table.column("key").to_pylist(), table.column("value").to_pylist(),
                       strict=True))
    assert pairs == [(b"a", b"2")] * 3 + [(b"b", b"2")] * 2 + [(b"c", b"2")]

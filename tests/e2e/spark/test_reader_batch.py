"""The batch reader (spark.read.format("npstream")) in real local Spark against a real broker.

The streams are shared by the module's tests (created once) to save time.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass

import pytest
from chispa import assert_df_equality

from npstream import Client
from npstream.spark.range_reader import spark_read_schema

pytestmark = pytest.mark.spark


@dataclass(frozen=True)
class Streams:
    plain: str       # 50 messages, offsets 0..49
    trimmed: str     # 50 messages, offsets below 20 removed by delete_messages
    timed: str       # 3 messages, then (after ``cut``) 4 more
    other: str       # 10 messages
    cut: dt.datetime


@pytest.fixture(scope="module")
def npstream_spark(spark):
    from npstream.spark import register

    register(spark)
    return spark


def publish(client: Client, stream: str, count: int, start: int = 0) -> None:
    client.publish_batch(stream, [{"value": f"v{i}".encode(), "id": f"{stream}-{i}"}
                                  for i in range(start, start + count)])


@pytest.fixture(scope="module")
def streams(broker) -> Streams:
    prefix = f"batch-{time.time_ns() % 10**8}"
    names = Streams(f"{prefix}-plain", f"{prefix}-trimmed", f"{prefix}-timed",
                    f"{prefix}-other", dt.datetime.now(dt.UTC))
    with Client(broker.address) as client:
        publish(client, names.plain, 50)
        publish(client, names.trimmed, 50)
        client.delete_messages(names.trimmed, before_offset=20)
        publish(client, names.other, 10)
        publish(client, names.timed, 3)
        time.sleep(0.05)
        cut = dt.datetime.now(dt.UTC)
        time.sleep(0.05)
        publish(client, names.timed, 4, start=3)
    return Streams(names.plain, names.trimmed, names.timed, names.other, cut)


def read(spark, broker, **options: str):
    reader = spark.read.format("npstream").option("broker", broker.address)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def offsets(frame) -> list[int]:
    return [r.offset for r in frame.select("offset").orderBy("offset").collect()]


def test_batch_read_with_ending_offsets_returns_exact_rows(npstream_spark, broker, client,
                                                           streams):
    stored = client.fetch(streams.plain, 0, max_messages=50).column("timestamp").to_pylist()
    frame = read(npstream_spark, broker, stream=streams.plain,
                 startingOffsets=json.dumps({streams.plain: 2}),
                 endingOffsets=json.dumps({streams.plain: 5}))
    expected = npstream_spark.createDataFrame(
        [(streams.plain, i, f"{streams.plain}-{i}", None, f"v{i}".encode(), stored[i])
         for i in (2, 3, 4)], schema=spark_read_schema(False))
    assert_df_equality(frame.orderBy("offset"), expected, ignore_nullable=True)


def test_batch_read_defaults_to_everything_of_several_streams(npstream_spark, broker, streams):
    frame = read(npstream_spark, broker, stream=f"{streams.plain},{streams.other}")
    counts = {r.stream: r["count"] for r in frame.groupBy("stream").count().collect()}
    assert counts == {streams.plain: 50, streams.other: 10}


def test_batch_read_stream_pattern_and_headers_column(npstream_spark, broker, streams):
    prefix = streams.plain.rsplit("-", 1)[0]
    frame = read(npstream_spark, broker, streamPattern=f"{prefix}-[op]*", includeHeaders="true")
    assert frame.schema == spark_read_schema(True)
    counts = {r.stream: r["count"] for r in frame.groupBy("stream").count().collect()}
    assert counts == {streams.plain: 50, streams.other: 10}


def test_batch_read_starting_and_ending_timestamp(npstream_spark, broker, streams):
    after = read(npstream_spark, broker, stream=streams.timed,
                 startingTimestamp=streams.cut.isoformat())
    before = read(npstream_spark, broker, stream=streams.timed,
                  endingTimestamp=str(int(streams.cut.timestamp() * 1000)))
    assert offsets(after) == [3, 4, 5, 6]
    assert offsets(before) == [0, 1, 2]


def test_batch_read_empty_range_returns_no_rows(npstream_spark, broker, streams):
    frame = read(npstream_spark, broker, stream=streams.plain,
                 startingOffsets=json.dumps({streams.plain: 50}))
    assert frame.count() == 0
    nothing = read(npstream_spark, broker, streamPattern="no-such-stream-*")
    assert nothing.collect() == []


def test_batch_read_over_grpc_equals_local_reads(npstream_spark, broker, streams):
    """Tasks here run on the broker's machine: localReads=false takes the gRPC path instead."""
    options = {"stream": f"{streams.plain},{streams.trimmed}", "includeHeaders": "true",
               "maxRecordsPerPartition": "9"}
    local = read(npstream_spark, broker, **options)
    remote = read(npstream_spark, broker, localReads="false", **options)
    assert local.count() == 80
    assert_df_equality(local.orderBy("stream", "offset"), remote.orderBy("stream", "offset"))


def test_batch_read_min_partitions_and_max_records_set_partition_count(
        npstream_spark, broker, streams):
    frame = read(npstream_spark, broker, stream=f"{streams.plain},{streams.other}",
                 minPartitions="6")
    assert frame.rdd.getNumPartitions() == 6
    capped = read(npstream_spark, broker, stream=streams.plain, maxRecordsPerPartition="7")
    assert capped.rdd.getNumPartitions() == 8  # ceil(50 / 7)
    assert offsets(capped) == list(range(50))


def test_batch_read_below_retention_fails_or_skips(npstream_spark, broker, streams):
    start = json.dumps({streams.trimmed: 0})
    with pytest.raises(Exception) as info:
        read(npstream_spark, broker, stream=streams.trimmed, startingOffsets=start).collect()
    message = str(info.value)
    assert f"Data loss on stream '{streams.trimmed}': offsets [0, 20)" in message
    assert "failOnDataLoss=false" in message
    skipped = read(npstream_spark, broker, stream=streams.trimmed, startingOffsets=start,
                   failOnDataLoss="false")
    assert offsets(skipped) == list(range(20, 50))


def test_batch_pushdown_offset_filter_never_touches_removed_offsets(
        npstream_spark, broker, streams):
    # Without the filter this read fails with data loss (test above): the filter
    # narrowed the fetch to offsets >= 25, above the removed [0, 20).
    frame = read(npstream_spark, broker, stream=streams.trimmed,
                 startingOffsets=json.dumps({streams.trimmed: 0}),
                 maxRecordsPerPartition="10").where("offset >= 25 AND offset < 45")
    assert offsets(frame) == list(range(25, 45))
    assert frame.rdd.getNumPartitions() == 2  # [25, 35) and [35, 45)


def test_batch_pushdown_offset_in_and_stream_filters(npstream_spark, broker, streams):
    frame = read(npstream_spark, broker, stream=f"{streams.plain},{streams.other}",
                 maxRecordsPerPartition="5").where(
        f"stream = '{streams.plain}' AND offset IN (12, 3, 7)")
    assert offsets(frame) == [3, 7, 12]
    assert frame.rdd.getNumPartitions() == 2  # [3, 8) and [8, 13) of one stream


def test_batch_pushdown_timestamp_filter_narrows_fetch(npstream_spark, broker, streams,
                                                       client):
    stored = client.fetch(streams.timed, 0).column("timestamp").to_pylist()
    frame = read(npstream_spark, broker, stream=streams.timed).where(
        npstream_spark_column_ge("timestamp", stored[3]))
    assert offsets(frame) == [3, 4, 5, 6]
    assert frame.rdd.getNumPartitions() == 1


def npstream_spark_column_ge(column: str, moment: dt.datetime) -> str:
    return f"{column} >= TIMESTAMP '{moment.astimezone(dt.UTC).isoformat()}'"


def test_batch_pushdown_off_still_reads_correctly(npstream_spark, broker, streams):
    conf = "spark.sql.python.filterPushdown.enabled"
    npstream_spark.conf.set(conf, "false")
    try:
        frame = read(npstream_spark, broker, stream=streams.plain).where("offset >= 45")
        assert offsets(frame) == [45, 46, 47, 48, 49]
    finally:
        npstream_spark.conf.set(conf, "true")


def test_batch_read_bad_option_fails_naming_option_value_and_accepted(
        npstream_spark, broker, streams):
    with pytest.raises(Exception) as info:
        read(npstream_spark, broker, stream=streams.plain, minPartitions="many").collect()
    assert ("Invalid value 'many' for option 'minPartitions': not an integer. "
            "Accepted: a positive integer.") in str(info.value)
    with pytest.raises(Exception) as info:
        read(npstream_spark, broker, stream=streams.plain,
             endingOffsets=json.dumps({streams.plain: 500})).collect()
    assert f"offset 500 for stream '{streams.plain}' is beyond its end_offset 50" in str(
        info.value)


def test_batch_read_without_split_options_splits_a_large_stream_by_parallelism(
        npstream_spark, broker):
    import pyarrow as pa

    from npstream.spark.partitioning import AUTO_SPLIT_MIN_ROWS

    stream = f"batch-auto-{time.time_ns() % 10**8}"
    rows = 2 * AUTO_SPLIT_MIN_ROWS
    with Client(broker.address) as client:
        client.publish_batch(stream, pa.table({"value": pa.array([b"x"] * rows, pa.binary())}))
    frame = read(npstream_spark, broker, stream=stream)
    assert frame.rdd.getNumPartitions() == 2  # [0, 250000) and [250000, 500000)
    assert frame.count() == rows
    assert read(npstream_spark, broker, stream=stream,
                minPartitions="1").rdd.getNumPartitions() == 1
    assert read(npstream_spark, broker, stream=stream,
                defaultParallelism="1").rdd.getNumPartitions() == 1

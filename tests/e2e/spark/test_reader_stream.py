"""The streaming reader in real local Spark against a real broker.

Every query uses Trigger.AvailableNow (deterministic batch counts, stops by
itself) except the pattern test, which needs a running query.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from pathlib import Path

import pytest
from chispa import assert_df_equality

from npstream import Client
from npstream.proto import pb
from npstream.spark.range_reader import spark_read_schema

pytestmark = pytest.mark.spark

QUERY_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def npstream_spark(spark):
    from npstream.spark import register

    register(spark)
    return spark


def publish(client: Client, stream: str, count: int, start: int = 0) -> None:
    client.publish_batch(stream, [{"value": f"v{i}".encode(), "id": f"{stream}-{i}"}
                                  for i in range(start, start + count)])


def read_stream(spark, broker, **options: str):
    reader = spark.readStream.format("npstream").option("broker", broker.address)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_to_memory(frame, checkpoint: Path | None = None):
    """Run an AvailableNow query into a memory table; return (query, table name)."""
    name = f"q_{uuid.uuid4().hex[:12]}"
    writer = frame.writeStream.format("memory").queryName(name).trigger(availableNow=True)
    if checkpoint is not None:
        writer = writer.option("checkpointLocation", str(checkpoint))
    query = writer.start()
    assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish"
    return query, name


def end_offsets_of(query) -> list[dict[str, int]]:
    return [json.loads(p["sources"][0]["endOffset"]) for p in query.recentProgress
            if p["numInputRows"]]


def rows_in(spark, table: str) -> list[tuple[str, int, str]]:
    return [(r.stream, r.offset, r.value.decode()) for r in
            spark.table(table).orderBy("stream", "offset").collect()]


def test_load_schema_without_and_with_headers(npstream_spark, broker, client, stream_name):
    client.create_stream(stream_name)
    plain = read_stream(npstream_spark, broker, stream=stream_name)
    assert plain.schema == spark_read_schema(False)
    with_headers = read_stream(npstream_spark, broker, stream=stream_name,
                               includeHeaders="true")
    assert with_headers.schema == spark_read_schema(True)
    assert with_headers.schema.simpleString().endswith(",headers:map<string,binary>>")


def test_stream_read_to_memory_returns_exact_rows(npstream_spark, broker, client, stream_name):
    client.publish_batch(stream_name, [
        {"value": b"alpha", "id": "m0", "key": b"k1", "headers": {"h": b"1"}},
        {"value": b"beta", "id": "m1"},
        {"value": b"", "id": "m2", "key": b"", "headers": {"a": b"x", "b": b""}},
    ])
    stored = client.fetch(stream_name, 0).column("timestamp").to_pylist()

    query, table = run_to_memory(read_stream(
        npstream_spark, broker, stream=stream_name, startingOffsets="earliest",
        includeHeaders="true"))

    expected = npstream_spark.createDataFrame([
        (stream_name, 0, "m0", b"k1", b"alpha", stored[0], {"h": b"1"}),
        (stream_name, 1, "m1", None, b"beta", stored[1], None),
        (stream_name, 2, "m2", b"", b"", stored[2], {"a": b"x", "b": b""}),
    ], schema=spark_read_schema(True))
    actual = npstream_spark.table(table)
    assert_df_equality(actual.orderBy("offset"), expected.orderBy("offset"),
                       ignore_nullable=True)
    assert [p["numInputRows"] for p in query.recentProgress] == [3]
    assert json.loads(query.recentProgress[0]["sources"][0]["latestOffset"]) == {stream_name: 3}


def test_stream_restart_from_checkpoint_continues_without_loss_or_duplicates(
        npstream_spark, broker, client, stream_name, tmp_path):
    publish(client, stream_name, 30)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run() -> None:
        frame = read_stream(npstream_spark, broker, stream=stream_name,
                            startingOffsets=json.dumps({stream_name: 5}),
                            maxOffsetsPerTrigger="20")
        query = (frame.selectExpr("offset", "CAST(value AS STRING) AS value")
                 .writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(QUERY_TIMEOUT_S)
        assert query.exception() is None

    run()
    first = sorted(r.offset for r in npstream_spark.read.parquet(str(out)).collect())
    publish(client, stream_name, 20, start=30)
    run()
    rows = npstream_spark.read.parquet(str(out)).orderBy("offset").collect()

    assert first == list(range(5, 30))
    assert [r.offset for r in rows] == list(range(5, 50))
    assert [r.value for r in rows] == [f"v{i}" for i in range(5, 50)]


def test_stream_max_offsets_per_trigger_shares_batches_fairly_across_streams(
        npstream_spark, broker, client, stream_name):
    big, small = f"{stream_name}-big", f"{stream_name}-small"
    publish(client, big, 90)
    publish(client, small, 30)

    query, table = run_to_memory(read_stream(
        npstream_spark, broker, stream=f"{big},{small}", startingOffsets="earliest",
        maxOffsetsPerTrigger="40"))

    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [
        40, 40, 40]
    assert end_offsets_of(query) == [{big: 30, small: 10}, {big: 60, small: 20},
                                     {big: 90, small: 30}]
    assert len(rows_in(npstream_spark, table)) == 120


def test_stream_available_now_with_max_offsets_runs_four_batches_and_stops(
        npstream_spark, broker, client, stream_name):
    publish(client, stream_name, 100)

    query, table = run_to_memory(read_stream(
        npstream_spark, broker, stream=stream_name, startingOffsets="earliest",
        maxOffsetsPerTrigger="30"))

    assert not query.isActive
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [
        30, 30, 30, 10]
    assert [r[1] for r in rows_in(npstream_spark, table)] == list(range(100))


def test_stream_min_partitions_and_max_records_split_into_expected_partitions(
        npstream_spark, broker, client, stream_name):
    big, small = f"{stream_name}-a", f"{stream_name}-b"
    publish(client, big, 30)
    publish(client, small, 10)
    frame = read_stream(npstream_spark, broker, stream=f"{big},{small}",
                        startingOffsets="earliest", minPartitions="5",
                        maxRecordsPerPartition="6")

    query, table = run_to_memory(frame.selectExpr("stream", "offset",
                                                  "spark_partition_id() AS pid"))
    assert query.exception() is None

    pieces = npstream_spark.sql(
        f"SELECT stream, min(offset) AS lo, max(offset) AS hi FROM {table} GROUP BY pid, stream"
    ).collect()
    # big: max(4 by its share of minPartitions, ceil(30/6)=5) = 5 pieces of 6;
    # small: max(1, ceil(10/6)=2) = 2 pieces of 5.
    assert sorted((r.stream, r.lo, r.hi) for r in pieces) == [
        (big, 0, 5), (big, 6, 11), (big, 12, 17), (big, 18, 23), (big, 24, 29),
        (small, 0, 4), (small, 5, 9)]


def test_stream_pattern_picks_up_stream_created_after_start(
        npstream_spark, broker, client, stream_name):
    first, later = f"{stream_name}-1", f"{stream_name}-2"
    publish(client, first, 3)
    name = f"q_{uuid.uuid4().hex[:12]}"
    query = (read_stream(npstream_spark, broker, streamPattern=f"{stream_name}-*",
                         startingOffsets="latest")
             .writeStream.format("memory").queryName(name)
             .trigger(processingTime="500 milliseconds").start())
    try:
        wait_until(lambda: query.lastProgress is not None, "first batch")
        client.create_stream(f"{stream_name}-empty")  # joins with nothing to read
        wait_until(lambda: f"{stream_name}-empty" in (
            query.lastProgress["sources"][0]["endOffset"] or ""), "empty stream joined")
        publish(client, first, 2, start=3)
        publish(client, later, 4)
        wait_until(lambda: len(rows_in(npstream_spark, name)) >= 6, "rows of both streams")
        assert query.exception() is None
    finally:
        query.stop()
    assert rows_in(npstream_spark, name) == [
        (first, 3, "v3"), (first, 4, "v4"),
        (later, 0, "v0"), (later, 1, "v1"), (later, 2, "v2"), (later, 3, "v3")]


def wait_until(condition, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_stream_fail_on_data_loss_true_fails_then_false_skips_gap(
        npstream_spark, broker, client, stream_name, tmp_path):
    publish(client, stream_name, 10)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run(fail: str):
        frame = read_stream(npstream_spark, broker, stream=stream_name,
                            startingOffsets="earliest", failOnDataLoss=fail)
        query = (frame.select("offset").writeStream.format("parquet")
                 .option("path", str(out)).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(QUERY_TIMEOUT_S)
        except Exception as exc:  # the query failed: awaitTermination re-raises it
            return str(exc)
        return None

    assert run("true") is None  # reads [0, 10)
    publish(client, stream_name, 40, start=10)
    client.delete_messages(stream_name, before_offset=30)

    error = run("true")
    assert error is not None
    assert f"Data loss on stream '{stream_name}': offsets [10, 30) can no longer be read" in error
    assert "retention moved the stream's start_offset to 30" in error
    assert "set the option failOnDataLoss=false" in error

    assert run("false") is None
    read_back = npstream_spark.read.parquet(str(out)).orderBy("offset").collect()
    assert [r.offset for r in read_back] == list(range(10)) + list(range(30, 50))


def read_all_with_group(spark, broker, client: Client, stream: str, group: str) -> None:
    """Publish 10 messages and read them in a query that records its position in ``group``."""
    publish(client, stream, 10)
    query, _ = run_to_memory(read_stream(spark, broker, stream=stream,
                                         startingOffsets="earliest", group=group))
    assert query.exception() is None
    wait_until(lambda: describe(client, stream, group).committed_offset == 10,
               "group commit", timeout=30)


def test_stream_group_commit_is_visible_and_starts_next_query(
        npstream_spark, broker, client, stream_name):
    group = "etl"
    read_all_with_group(npstream_spark, broker, client, stream_name, group)
    publish(client, stream_name, 5, start=10)
    info = describe(client, stream_name, group)
    assert (info.committed_offset, info.lag) == (10, 5)

    resumed, table = run_to_memory(read_stream(npstream_spark, broker, stream=stream_name,
                                               startingOffsets="group", group=group))
    assert resumed.exception() is None
    assert [r[1] for r in rows_in(npstream_spark, table)] == list(range(10, 15))


def test_stream_group_start_after_retention_removed_unread_fails_naming_the_range(
        npstream_spark, broker, client, stream_name):
    group = "etl"
    read_all_with_group(npstream_spark, broker, client, stream_name, group)
    publish(client, stream_name, 40, start=10)
    client.delete_messages(stream_name, before_offset=30)

    with pytest.raises(Exception) as info:
        run_to_memory(read_stream(npstream_spark, broker, stream=stream_name,
                                  startingOffsets="group", group=group))
    assert (f"Data loss on stream '{stream_name}': offsets [10, 30) can no longer be read "
            f"(group '{group}' asks for offset 10 but retention moved the stream's "
            "start_offset to 30)") in str(info.value)

    skipped, table = run_to_memory(read_stream(npstream_spark, broker, stream=stream_name,
                                               startingOffsets="group", group=group,
                                               failOnDataLoss="false"))
    assert skipped.exception() is None
    assert [r[1] for r in rows_in(npstream_spark, table)] == list(range(30, 50))


def describe(client: Client, stream: str, group: str):
    return client.call("GroupService.DescribeGroup",
                       pb.DescribeGroupRequest(stream=stream, group=group))


def test_stream_starting_timestamp_skips_older_messages(npstream_spark, broker, client,
                                                        stream_name):
    publish(client, stream_name, 3)
    time.sleep(0.05)
    cut = dt.datetime.now(dt.UTC)
    time.sleep(0.05)
    publish(client, stream_name, 2, start=3)

    query, table = run_to_memory(read_stream(npstream_spark, broker, stream=stream_name,
                                             startingTimestamp=cut.isoformat()))
    assert query.exception() is None
    assert [r[1] for r in rows_in(npstream_spark, table)] == [3, 4]


def test_stream_unknown_option_fails_at_load_naming_it(npstream_spark, broker, stream_name):
    with pytest.raises(Exception, match="Unknown option 'maxoffsetpertrigger'") as info:
        read_stream(npstream_spark, broker, stream=stream_name, maxOffsetPerTrigger="5")
    assert "Did you mean 'maxOffsetsPerTrigger'?" in str(info.value)


def test_stream_batch_only_option_fails_at_start(npstream_spark, broker, client, stream_name):
    client.create_stream(stream_name)
    frame = read_stream(npstream_spark, broker, stream=stream_name, endingOffsets="latest")
    query = frame.writeStream.format("memory").queryName(
        f"q_{uuid.uuid4().hex[:12]}").trigger(availableNow=True).start()
    with pytest.raises(Exception) as info:
        query.awaitTermination(QUERY_TIMEOUT_S)
    assert ("Option 'endingOffsets' (value 'latest') applies to batch reads (spark.read) only"
            in str(info.value))


def test_load_missing_stream_or_bad_option_fails_with_message_first(npstream_spark, broker,
                                                                    stream_name):
    """Errors found at load() are reported there, the message right after Spark's prefix
    (not as the last line of a traceback)."""
    from pyspark.errors import AnalysisException

    prefix = "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: "
    with pytest.raises(AnalysisException) as info:
        read_stream(npstream_spark, broker, stream=f"{stream_name}-nope")
    assert str(info.value).startswith(
        f"{prefix}npstream.errors.StreamNotFound: stream(s) '{stream_name}-nope' named by "
        f"option 'stream' do not exist on broker {broker.address}; create them first, or use "
        "streamPattern to pick streams up when they appear\n"), str(info.value)
    with pytest.raises(AnalysisException) as info:
        read_stream(npstream_spark, broker, stream=stream_name, startingOffsets="first")
    assert str(info.value).startswith(
        f"{prefix}npstream.spark.errors.InvalidOptionError: Invalid value 'first' for option "
        "'startingOffsets': "), str(info.value)

"""Typed streams written by real local Spark into a real broker: columns in, no to_json.

A DataFrame without a ``value`` column writes its columns (other than id,
key, headers, stream) as a typed stream's record; a struct ``value`` column
does the same. The target's schema is checked on the driver at query start;
``createStream=true`` creates a missing target with the DataFrame's schema
(docs/spark.md, "Writing typed streams").
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from npstream import Client

pytestmark = pytest.mark.spark

QUERY_TIMEOUT_S = 180
SCHEMA = ("sensorId STRING NOT NULL, reading DOUBLE, at TIMESTAMP, tags ARRAY<STRING>, "
          "attrs MAP<STRING, INT>, pos STRUCT<x: DOUBLE, y: DOUBLE>")
AT = dt.datetime(2026, 11, 24, 5, 30, 0, 250000, tzinfo=dt.UTC)


def record(i: int) -> dict:
    return {"sensorId": f"s{i % 3}", "reading": i / 4, "at": AT + dt.timedelta(seconds=i),
            "tags": [f"t{i}"], "attrs": {"n": i}, "pos": {"x": float(i), "y": None}}


def as_stored(i: int) -> dict:
    """record(i) as the client reads it back (maps come back as lists of pairs)."""
    value = record(i)
    return {**value, "attrs": list(value["attrs"].items())}


@pytest.fixture(scope="module")
def npstream_spark(spark):
    from npstream.spark import register

    register(spark)
    return spark


def stored(client: Client, stream: str) -> pa.Table:
    end = client.stream_info(stream).end_offset
    return pa.Table.from_batches(list(client.read_range(stream, 0, end)))


def test_streaming_copy_writes_columns_into_a_typed_stream_once(
        npstream_spark, broker, client, stream_name, tmp_path):
    source, target = f"{stream_name}-in", f"{stream_name}-out"
    client.create_stream(source, schema=SCHEMA)
    client.create_stream(target, schema=SCHEMA)
    client.publish_batch(source, [{"id": f"r{i}", "value": record(i)} for i in range(300)])

    def copy():
        return (npstream_spark.readStream.format("npstream").option("broker", broker.address)
                .option("stream", source).option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", "120").load()
                .writeStream.format("npstream").option("broker", broker.address)
                .option("stream", target).option("checkpointLocation", str(tmp_path / "cp"))
                .trigger(availableNow=True).start())

    query = copy()
    query.awaitTermination(QUERY_TIMEOUT_S)
    assert query.exception() is None
    client.publish_batch(source, [{"id": f"r{i}", "value": record(i)} for i in range(300, 350)])
    again = copy()
    again.awaitTermination(QUERY_TIMEOUT_S)
    assert again.exception() is None

    table = stored(client, target)
    assert table.column("id").to_pylist() == [f"r{i}" for i in range(350)]
    assert table.column("value").to_pylist() == [as_stored(i) for i in range(350)]
    assert [v.version for v in client.stream_info(target).schema_versions] == [1]


def test_batch_write_with_create_stream_takes_the_dataframe_schema(
        npstream_spark, broker, client, stream_name):
    frame = npstream_spark.createDataFrame(
        [(f"k{i}", f"s{i % 2}", i * 1.5, AT, i) for i in range(5)],
        "key STRING, sensorId STRING, reading DOUBLE, ts TIMESTAMP, seq BIGINT")
    (frame.write.format("npstream").option("broker", broker.address)
     .option("stream", stream_name).option("createStream", "true").mode("append").save())

    info = client.stream_info(stream_name)
    assert info.value_schema_ddl == "sensorId STRING, reading DOUBLE, ts TIMESTAMP, seq BIGINT"
    table = stored(client, stream_name)
    assert table.column("key").to_pylist() == [f"k{i}".encode() for i in range(5)]
    assert table.column("value").to_pylist() == [
        {"sensorId": f"s{i % 2}", "reading": i * 1.5, "ts": AT, "seq": i} for i in range(5)]


def test_struct_value_column_and_fewer_fields_than_the_schema(
        npstream_spark, broker, client, stream_name):
    client.create_stream(stream_name, schema=SCHEMA)
    frame = npstream_spark.createDataFrame(
        [("a", 1.0), ("b", None)], "sensorId STRING, reading DOUBLE"
    ).selectExpr("struct(sensorId, reading) AS value")
    frame.write.format("npstream").option("broker", broker.address) \
        .option("stream", stream_name).mode("append").save()
    missing = {"at": None, "tags": None, "attrs": None, "pos": None}
    assert stored(client, stream_name).column("value").to_pylist() == [
        {"sensorId": "a", "reading": 1.0, **missing}, {"sensorId": "b", "reading": None,
                                                        **missing}]


@pytest.mark.parametrize(("columns", "message"), [
    ("reading DOUBLE", r"column 'sensorId' is missing \(NOT NULL STRING\)"),
    ("sensorId STRING, reading STRING, color STRING",
     r"column 'reading' is STRING, expected DOUBLE; column 'color' is not in the stream's "
     r"value schema"),
])
def test_columns_that_cannot_be_written_fail_the_query_at_start_naming_them(
        npstream_spark, broker, client, stream_name, tmp_path, columns, message):
    client.create_stream(stream_name, schema=SCHEMA)
    frame = npstream_spark.createDataFrame([], columns)
    with pytest.raises(Exception, match=rf"typed stream '{stream_name}' \(value schema version "
                                        rf"1: sensorId STRING NOT NULL, .*\): {message}"):
        frame.write.format("npstream").option("broker", broker.address) \
            .option("stream", stream_name).mode("append").save()
    source = (npstream_spark.readStream.format("rate").load()
              .selectExpr(*[f"CAST(NULL AS {c.split()[1]}) AS {c.split()[0]}"
                            for c in columns.split(", ")]))
    query = source.writeStream.format("npstream").option("broker", broker.address) \
        .option("stream", stream_name) \
        .option("checkpointLocation", str(tmp_path / "cp")).start()
    with pytest.raises(Exception, match=message):  # before its first micro-batch
        query.awaitTermination(QUERY_TIMEOUT_S)
    assert query.recentProgress == [] or all(not p["numInputRows"]
                                             for p in query.recentProgress)
    assert client.stream_info(stream_name).end_offset == 0


def test_typed_rows_for_an_untyped_or_missing_stream_are_refused_at_start(
        npstream_spark, broker, client, stream_name):
    client.create_stream(stream_name)
    frame = npstream_spark.createDataFrame([("a", 1.0)], "sensorId STRING, reading DOUBLE")
    with pytest.raises(Exception, match=rf"Stream '{stream_name}' is untyped \(binary values\), "
                                        r"but the data is written as a typed stream's record"):
        frame.write.format("npstream").option("broker", broker.address) \
            .option("stream", stream_name).mode("append").save()
    with pytest.raises(Exception, match=r"does not exist, .* Set .option\('createStream', "
                                        r"'true'\) .* --schema 'sensorId STRING, reading "
                                        r"DOUBLE'"):
        frame.write.format("npstream").option("broker", broker.address) \
            .option("stream", f"{stream_name}-missing").mode("append").save()

"""Typed streams read by real local Spark from a real broker: columns, no from_json.

A typed stream reads as ``stream, offset, id, key, timestamp[, headers]`` plus
its value fields as columns (valueColumns=flatten) or one ``value`` struct
(valueColumns=struct); several streams are read together only when their
schemas are compatible (docs/spark.md, "Typed streams").
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid

import pytest

from npstream.spark.range_reader import spark_read_schema

pytestmark = pytest.mark.spark

QUERY_TIMEOUT_S = 180

SCHEMA = ("sensorId STRING NOT NULL, reading DOUBLE, at TIMESTAMP, day DATE, "
          "amount DECIMAL(10, 2), tags ARRAY<STRING>, attrs MAP<STRING, INT>, "
          "pos STRUCT<x: DOUBLE, y: DOUBLE>")
RECORDS = [
    {"sensorId": "s1", "reading": 21.5, "at": "2025-03-01T12:00:00.123456Z", "day": "2025-03-01",
     "amount": 12.5, "tags": ["a", "b"], "attrs": {"n": 1}, "pos": {"x": 1.0, "y": 2.0}},
    {"sensorId": "s2"},
]
AT = dt.datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
TREE = """root
 |-- stream: string (nullable = true)
 |-- offset: long (nullable = true)
 |-- id: string (nullable = true)
 |-- key: binary (nullable = true)
 |-- timestamp: timestamp (nullable = true)
 |-- sensorId: string (nullable = true)
 |-- reading: double (nullable = true)
 |-- at: timestamp (nullable = true)
 |-- day: date (nullable = true)
 |-- amount: decimal(10,2) (nullable = true)
 |-- tags: array (nullable = true)
 |    |-- element: string (containsNull = true)
 |-- attrs: map (nullable = true)
 |    |-- key: string
 |    |-- value: integer (valueContainsNull = true)
 |-- pos: struct (nullable = true)
 |    |-- x: double (nullable = true)
 |    |-- y: double (nullable = true)
"""


@pytest.fixture(scope="module")
def npstream_spark(spark):
    from npstream.spark import register

    register(spark)
    return spark


def read(spark, broker, **options: str):
    reader = spark.read.format("npstream").option("broker", broker.address)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def read_stream(spark, broker, **options: str):
    reader = spark.readStream.format("npstream").option("broker", broker.address)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def typed_stream(client, name: str, schema: str = SCHEMA,
                 records: list[dict] = RECORDS) -> list[dt.datetime]:
    """Create ``name`` typed, publish ``records`` (ids r0, r1, ...); the stored append times."""
    client.create_stream(name, schema=schema)
    client.publish_batch(name, [{"id": f"r{i}", "value": record}
                                for i, record in enumerate(records)])
    batches, _ = client.read_batches(name, 0, end_offset=len(records))
    stamps = [stamp for batch in batches for stamp in batch.column("timestamp").to_pylist()]
    now = dt.datetime.now(dt.UTC)
    assert all(abs(now - stamp) < dt.timedelta(minutes=5) for stamp in stamps), stamps
    return stamps


def expected_rows(stream: str, stamps: list[dt.datetime]) -> list[tuple]:
    return [
        (stream, 0, "r0", None, stamps[0], "s1", 21.5, AT, dt.date(2025, 3, 1),
         decimal.Decimal("12.50"), ["a", "b"], {"n": 1}, (1.0, 2.0)),
        (stream, 1, "r1", None, stamps[1], "s2", None, None, None, None, None, None, None),
    ]


def as_tuples(rows) -> list[tuple]:
    return [tuple(tuple(v) if hasattr(v, "asDict") else v for v in row) for row in rows]


def utc(moment: dt.datetime) -> dt.datetime:
    # collect() gives naive datetimes in the session time zone (UTC in these tests).
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment


def test_batch_read_flattens_the_fields_into_columns(npstream_spark, broker, client, stream_name):
    stamps = typed_stream(client, stream_name)
    frame = read(npstream_spark, broker, stream=stream_name)
    assert frame.schema.treeString() == TREE
    rows = as_tuples(frame.orderBy("offset").collect())
    rows = [(*row[:4], utc(row[4]), *row[5:7], row[7] and utc(row[7]), *row[8:]) for row in rows]
    assert rows == expected_rows(stream_name, stamps)
    # Columns are plain Spark columns: no from_json, filters and aggregates just work.
    assert frame.where("reading > 20").select("sensorId").collect()[0].sensorId == "s1"
    # Offsets and pushdown are unchanged.
    assert [r.offset for r in frame.where("offset >= 1").collect()] == [1]


def test_streaming_query_reads_typed_columns(npstream_spark, broker, client, stream_name):
    stamps = typed_stream(client, stream_name)
    frame = read_stream(npstream_spark, broker, stream=stream_name, startingOffsets="earliest",
                        includeHeaders="true")
    assert frame.columns == ["stream", "offset", "id", "key", "timestamp", "headers",
                             "sensorId", "reading", "at", "day", "amount", "tags", "attrs",
                             "pos"]
    name = f"q_{uuid.uuid4().hex[:12]}"
    query = (frame.writeStream.format("memory").queryName(name)
             .trigger(availableNow=True).start())
    assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish"
    rows = as_tuples(npstream_spark.table(name).drop("headers").orderBy("offset").collect())
    rows = [(*row[:4], utc(row[4]), *row[5:7], row[7] and utc(row[7]), *row[8:]) for row in rows]
    assert rows == expected_rows(stream_name, stamps)
    assert [p["numInputRows"] for p in query.recentProgress] == [2]
    assert json.loads(query.recentProgress[0]["sources"][0]["endOffset"]) == {stream_name: 2}


def test_struct_mode_gives_one_value_struct_column(npstream_spark, broker, client, stream_name):
    typed_stream(client, stream_name, "sensorId STRING NOT NULL, reading DOUBLE",
                 [{"sensorId": "s1", "reading": 21.5}, {"sensorId": "s2"}])
    frame = read(npstream_spark, broker, stream=stream_name, valueColumns="struct")
    assert frame.schema.simpleString() == (
        "struct<stream:string,offset:bigint,id:string,key:binary,timestamp:timestamp,"
        "value:struct<sensorId:string,reading:double>>")
    rows = frame.orderBy("offset").select("value.sensorId", "value.reading").collect()
    assert [tuple(r) for r in rows] == [("s1", 21.5), ("s2", None)]


def test_two_versions_read_with_nulls_for_old_rows(npstream_spark, broker, client, stream_name):
    client.create_stream(stream_name, schema="sensorId STRING NOT NULL, reading FLOAT")
    client.publish(stream_name, {"sensorId": "old", "reading": 1.5})
    client.update_stream(stream_name,
                         schema="sensorId STRING NOT NULL, reading DOUBLE, unit STRING")
    client.publish(stream_name, {"sensorId": "new", "reading": 2.25, "unit": "C"})
    frame = read(npstream_spark, broker, stream=stream_name)
    assert frame.columns[-3:] == ["sensorId", "reading", "unit"]
    assert frame.schema["reading"].dataType.simpleString() == "double"  # widened
    rows = [tuple(r) for r in frame.orderBy("offset").select("sensorId", "reading", "unit")
            .collect()]
    assert rows == [("old", 1.5, None), ("new", 2.25, "C")]


def test_several_typed_streams_with_compatible_schemas_read_together(npstream_spark, broker,
                                                                     client, stream_name):
    first, second = f"{stream_name}-a", f"{stream_name}-b"
    client.create_stream(first, schema="sensorId STRING NOT NULL, reading DOUBLE")
    client.create_stream(second, schema="reading DOUBLE, sensorId STRING")  # order differs
    client.publish(first, {"sensorId": "a", "reading": 1.0})
    client.publish(second, {"sensorId": "b", "reading": 2.0})
    frame = read(npstream_spark, broker, streamPattern=f"{stream_name}-*")
    assert frame.columns[-2:] == ["sensorId", "reading"]
    rows = [tuple(r) for r in frame.orderBy("stream").select("stream", "sensorId", "reading")
            .collect()]
    assert rows == [(first, "a", 1.0), (second, "b", 2.0)]


def test_incompatible_or_mixed_streams_and_name_clashes_are_refused_at_load(
        npstream_spark, broker, client, stream_name):
    typed, other, plain, clash = (f"{stream_name}-{s}" for s in ("t", "o", "p", "c"))
    client.create_stream(typed, schema="sensorId STRING, reading DOUBLE")
    client.create_stream(other, schema="sensorId STRING, reading INT")
    client.create_stream(plain)
    client.create_stream(clash, schema="offset BIGINT, reading DOUBLE")

    with pytest.raises(Exception) as info:
        read(npstream_spark, broker, stream=f"{typed},{other}")
    assert (f"Typed streams '{other}' and '{typed}' have incompatible value schemas: field "
            f"'reading' is int in '{other}' and double in '{typed}'.") in str(info.value)

    with pytest.raises(Exception) as info:
        read_stream(npstream_spark, broker, stream=f"{typed},{plain}")
    assert (f"Cannot read typed and untyped streams together: typed '{typed}', untyped "
            f"'{plain}'.") in str(info.value)

    with pytest.raises(Exception) as info:
        read(npstream_spark, broker, stream=clash)
    assert (f"Stream '{clash}' has value field(s) 'offset' named like the source's column(s) "
            "'offset'; with valueColumns=flatten (the default) they would collide. Set "
            ".option(\"valueColumns\", \"struct\")") in str(info.value)
    frame = read(npstream_spark, broker, stream=clash, valueColumns="struct")
    assert frame.schema["value"].dataType.simpleString() == "struct<offset:bigint,reading:double>"


def test_untyped_streams_read_as_before(npstream_spark, broker, client, stream_name):
    client.publish(stream_name, b"raw")
    frame = read(npstream_spark, broker, stream=stream_name, valueColumns="struct")
    assert frame.schema == spark_read_schema(False)
    assert [r.value for r in frame.collect()] == [b"raw"]

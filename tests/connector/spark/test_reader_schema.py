"""The read schema and the Arrow batches handed to Spark (pure: no broker, no Spark session)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.spark.range_reader import arrow_read_schema, spark_read_schema, to_spark_batch


def stored_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "offset": [5, 6],
            "id": ["m5", "m6"],
            "key": [b"k", None],
            "value": [b"v5", b"v6"],
            "timestamp": [dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
                          dt.datetime(2025, 1, 1, 0, 0, 0, 1000, tzinfo=dt.UTC)],
            "headers": [[("h", b"1")], None],
        },
        schema=MESSAGE_SCHEMA,
    )


@pytest.mark.parametrize("include_headers", [False, True])
def test_arrow_schema_matches_what_spark_expects(include_headers):
    # Spark rejects a batch whose schema differs from to_arrow_schema(declared).
    expected = to_arrow_schema(spark_read_schema(include_headers), timezone="UTC")
    assert arrow_read_schema(include_headers).equals(expected)


def test_spark_schema_columns_without_and_with_headers():
    assert spark_read_schema(False).simpleString() == (
        "struct<stream:string,offset:bigint,id:string,key:binary,value:binary,"
        "timestamp:timestamp>")
    assert spark_read_schema(True).simpleString().endswith(",headers:map<string,binary>>")


def test_to_spark_batch_adds_stream_and_converts_timestamp_to_micros():
    out = to_spark_batch(stored_batch(), "orders", arrow_read_schema(False))
    assert out.schema.equals(arrow_read_schema(False))
    assert out.to_pydict() == {
        "stream": ["orders", "orders"],
        "offset": [5, 6],
        "id": ["m5", "m6"],
        "key": [b"k", None],
        "value": [b"v5", b"v6"],
        "timestamp": [dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
                      dt.datetime(2025, 1, 1, 0, 0, 0, 1000, tzinfo=dt.UTC)],
    }


def test_to_spark_batch_keeps_headers_when_asked():
    out = to_spark_batch(stored_batch(), "orders", arrow_read_schema(True))
    assert out.schema.equals(arrow_read_schema(True))
    assert out.column("headers").to_pylist() == [[("h", b"1")], None]


def test_to_spark_batch_of_empty_batch_is_empty():
    empty = MESSAGE_SCHEMA.empty_table().to_batches()
    batch = empty[0] if empty else pa.RecordBatch.from_pylist([], schema=MESSAGE_SCHEMA)
    out = to_spark_batch(batch, "s", arrow_read_schema(False))
    assert out.num_rows == 0 and out.schema.equals(arrow_read_schema(False))

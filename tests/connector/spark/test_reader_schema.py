"""The read schema and the Arrow batches handed to Spark (pure: no broker, no Spark session).

Untyped streams read with a binary ``value``; typed streams with their value
fields as columns (flatten) or one struct (struct). ``build_read_schema``
decides from the streams' value schemas; ``to_spark_batch`` projects a stored
batch to exactly the Arrow schema Spark checks (``to_arrow_schema`` of the
declared schema).
"""

from __future__ import annotations

import datetime as dt
import decimal
import pickle

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.spark.range_reader import arrow_read_schema, spark_read_schema, to_spark_batch
from npstream.spark.read_schema import (
    ReadSchema,
    ReadSchemaError,
    build_read_schema,
    spark_value_fields,
)

UTC = dt.UTC
T0 = dt.datetime(2025, 1, 1, tzinfo=UTC)
T1 = dt.datetime(2025, 1, 1, 0, 0, 0, 1000, tzinfo=UTC)

READINGS = pa.schema([
    pa.field("sensorId", pa.string(), nullable=False),
    pa.field("reading", pa.float64()),
])


def stored_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "offset": [5, 6],
            "id": ["m5", "m6"],
            "key": [b"k", None],
            "value": [b"v5", b"v6"],
            "timestamp": [T0, T1],
            "headers": [[("h", b"1")], None],
        },
        schema=MESSAGE_SCHEMA,
    )


def stored_schema(value_schema: pa.Schema) -> pa.Schema:
    """MESSAGE_SCHEMA with value = a non-null struct of the value fields (the stored form)."""
    index = MESSAGE_SCHEMA.get_field_index("value")
    return MESSAGE_SCHEMA.set(index, pa.field("value", pa.struct(list(value_schema)),
                                              nullable=False))


def typed_batch(value_schema: pa.Schema, values: list[dict], offset: int = 0) -> pa.RecordBatch:
    count = len(values)
    return pa.RecordBatch.from_pydict(
        {
            "offset": list(range(offset, offset + count)),
            "id": [f"m{offset + i}" for i in range(count)],
            "key": [None] * count,
            "value": values,
            "timestamp": [T0] * count,
            "headers": [None] * count,
        },
        schema=stored_schema(value_schema),
    )


def spark_checks(schema: ReadSchema, batch: pa.RecordBatch) -> None:
    """What Spark's Python data source worker checks of every returned batch."""
    assert batch.schema.equals(to_arrow_schema(schema.spark_schema(), timezone="UTC"))


# ---------------------------------------------------------------- untyped


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
    out = to_spark_batch(stored_batch(), "orders", ReadSchema(False))
    assert out.schema.equals(arrow_read_schema(False))
    assert out.to_pydict() == {
        "stream": ["orders", "orders"],
        "offset": [5, 6],
        "id": ["m5", "m6"],
        "key": [b"k", None],
        "value": [b"v5", b"v6"],
        "timestamp": [T0, T1],
    }


def test_to_spark_batch_keeps_headers_when_asked():
    out = to_spark_batch(stored_batch(), "orders", ReadSchema(True))
    assert out.schema.equals(arrow_read_schema(True))
    assert out.column("headers").to_pylist() == [[("h", b"1")], None]


def test_to_spark_batch_of_empty_batch_is_empty():
    batch = pa.RecordBatch.from_pylist([], schema=MESSAGE_SCHEMA)
    out = to_spark_batch(batch, "s", ReadSchema(False))
    assert out.num_rows == 0 and out.schema.equals(arrow_read_schema(False))


def test_no_streams_or_only_untyped_ones_read_untyped():
    assert build_read_schema({}, False) == ReadSchema(False)
    assert build_read_schema({"a": None, "b": None}, True, "struct") == ReadSchema(True)
    # valueColumns has no effect on untyped streams.
    assert build_read_schema({"a": None}, False, "struct").spark_schema() == \
        spark_read_schema(False)


# ---------------------------------------------------------------- typed: the schema


def test_typed_flatten_schema_puts_value_fields_after_the_envelope():
    schema = build_read_schema({"r": READINGS}, False)
    assert schema.typed and schema.flattened
    assert schema.spark_schema() == StructType([
        StructField("stream", StringType()),
        StructField("offset", LongType()),
        StructField("id", StringType()),
        StructField("key", BinaryType()),
        StructField("timestamp", TimestampType()),
        StructField("sensorId", StringType()),   # NOT NULL in the schema: nullable here
        StructField("reading", DoubleType()),
    ])


def test_typed_struct_schema_has_one_value_column_last():
    schema = build_read_schema({"r": READINGS}, True, "struct")
    assert schema.spark_schema().simpleString() == (
        "struct<stream:string,offset:bigint,id:string,key:binary,timestamp:timestamp,"
        "headers:map<string,binary>,value:struct<sensorId:string,reading:double>>")


def test_spark_types_of_every_supported_arrow_type():
    value_schema = pa.schema([
        pa.field("b", pa.bool_()), pa.field("i8", pa.int8()), pa.field("i16", pa.int16()),
        pa.field("i32", pa.int32(), nullable=False), pa.field("i64", pa.int64()),
        pa.field("f32", pa.float32()), pa.field("f64", pa.float64()),
        pa.field("dec", pa.decimal128(12, 3)), pa.field("s", pa.string()),
        pa.field("bin", pa.binary()), pa.field("d", pa.date32()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("l", pa.list_(pa.field("item", pa.int32(), nullable=False))),
        pa.field("st", pa.struct([pa.field("x", pa.string(), nullable=False)])),
        pa.field("m", pa.map_(pa.string(), pa.list_(pa.float64()))),
    ])
    fields = spark_value_fields(value_schema)
    assert fields.simpleString() == (
        "struct<b:boolean,i8:tinyint,i16:smallint,i32:int,i64:bigint,f32:float,f64:double,"
        "dec:decimal(12,3),s:string,bin:binary,d:date,ts:timestamp,l:array<int>,"
        "st:struct<x:string>,m:map<string,array<double>>>")
    assert fields["dec"].dataType == DecimalType(12, 3)
    assert fields["d"].dataType == DateType()
    # Every field, element and map value is nullable (a later version may drop NOT NULL).
    assert fields["i32"].nullable
    assert fields["l"].dataType == ArrayType(IntegerType(), True)
    assert fields["st"].dataType == StructType([StructField("x", StringType(), True)])
    assert fields["m"].dataType == MapType(StringType(), ArrayType(DoubleType(), True), True)


def test_compatible_streams_may_order_fields_differently():
    reordered = pa.schema([pa.field("reading", pa.float64(), nullable=False),
                           pa.field("sensorId", pa.string())])
    schema = build_read_schema({"b": reordered, "a": READINGS}, False)
    # The fields come in the order of the first stream by name ('a').
    assert schema.value_fields is not None
    assert schema.value_fields.fieldNames() == ["sensorId", "reading"]


def test_streams_with_a_differing_field_type_are_refused_naming_both_and_the_field():
    other = pa.schema([pa.field("sensorId", pa.string()), pa.field("reading", pa.int32())])
    with pytest.raises(ReadSchemaError) as info:
        build_read_schema({"r1": READINGS, "r2": other}, False)
    assert str(info.value) == (
        "Typed streams 'r1' and 'r2' have incompatible value schemas: field 'reading' is "
        "double in 'r1' and int in 'r2'. Streams read together must have the same fields "
        "with the same types; read them in separate queries.")


def test_streams_with_a_missing_field_are_refused_naming_where_it_is():
    more = READINGS.append(pa.field("unit", pa.string()))
    with pytest.raises(ReadSchemaError) as info:
        build_read_schema({"r1": READINGS, "r2": more}, False, "struct")
    assert str(info.value) == (
        "Typed streams 'r1' and 'r2' have incompatible value schemas: field 'unit' is in "
        "'r2' but not in 'r1'. Streams read together must have the same fields with the "
        "same types; read them in separate queries.")


def test_typed_and_untyped_streams_together_are_refused():
    with pytest.raises(ReadSchemaError) as info:
        build_read_schema({"t1": READINGS, "u1": None, "t2": READINGS, "u2": None}, False)
    assert str(info.value) == (
        "Cannot read typed and untyped streams together: typed 't1', 't2', untyped 'u1', "
        "'u2'. An untyped stream's value is binary, a typed stream's value is columns; read "
        "them in separate queries.")


def test_field_named_like_an_envelope_column_needs_struct_mode():
    clash = pa.schema([pa.field("Offset", pa.int64()), pa.field("key", pa.string()),
                       pa.field("value", pa.string())])
    with pytest.raises(ReadSchemaError) as info:
        build_read_schema({"r": clash}, False)
    assert str(info.value) == (
        "Stream 'r' has value field(s) 'Offset', 'key' named like the source's column(s) "
        "'offset', 'key'; with valueColumns=flatten (the default) they would collide. Set "
        ".option(\"valueColumns\", \"struct\") to read the value as one 'value' struct "
        "column (then select value.Offset).")
    # 'value' itself is free in flatten mode; 'headers' only collides when it is read.
    headers = pa.schema([pa.field("headers", pa.string()), pa.field("value", pa.string())])
    assert build_read_schema({"r": headers}, False).flattened
    with pytest.raises(ReadSchemaError, match="'headers' named like"):
        build_read_schema({"r": headers}, True)
    assert build_read_schema({"r": clash}, True, "struct").typed


def test_read_schema_pickles_for_the_executors():
    schema = build_read_schema({"r": READINGS}, False)
    _ = schema.arrow_schema  # cached before pickling, as on the driver
    copy = pickle.loads(pickle.dumps(schema))
    assert copy == schema and copy.arrow_schema.equals(schema.arrow_schema)


# ---------------------------------------------------------------- typed: the batches


def test_flatten_projects_the_struct_children_to_top_level_columns():
    schema = build_read_schema({"r": READINGS}, False)
    batch = typed_batch(READINGS, [{"sensorId": "s1", "reading": 21.5},
                                   {"sensorId": "s2", "reading": None}], offset=7)
    out = to_spark_batch(batch, "r", schema)
    spark_checks(schema, out)
    assert out.to_pydict() == {
        "stream": ["r", "r"], "offset": [7, 8], "id": ["m7", "m8"], "key": [None, None],
        "timestamp": [T0, T0], "sensorId": ["s1", "s2"], "reading": [21.5, None],
    }
    # Zero copy: the column is the struct's child, not a copy of it.
    child = batch.column("value").field(1)
    assert out.column("reading").buffers()[1].address == child.buffers()[1].address


def test_flatten_of_a_sliced_batch_keeps_the_right_rows():
    schema = build_read_schema({"r": READINGS}, False)
    batch = typed_batch(READINGS, [{"sensorId": f"s{i}", "reading": float(i)}
                                   for i in range(5)]).slice(2, 2)
    out = to_spark_batch(batch, "r", schema)
    assert out.column("sensorId").to_pylist() == ["s2", "s3"]
    assert out.column("reading").to_pylist() == [2.0, 3.0]


def test_struct_mode_passes_the_value_struct_with_declared_types():
    schema = build_read_schema({"r": READINGS}, True, "struct")
    batch = typed_batch(READINGS, [{"sensorId": "s1", "reading": 1.0}])
    out = to_spark_batch(batch, "r", schema)
    spark_checks(schema, out)
    assert out.column("value").to_pylist() == [{"sensorId": "s1", "reading": 1.0}]
    assert out.column("headers").to_pylist() == [None]


NESTED = pa.schema([
    pa.field("dec", pa.decimal128(10, 2)),
    pa.field("day", pa.date32()),
    pa.field("at", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("tags", pa.list_(pa.field("item", pa.string(), nullable=False))),
    pa.field("pos", pa.struct([pa.field("x", pa.float64(), nullable=False),
                               pa.field("y", pa.float64())])),
    pa.field("attrs", pa.map_(pa.string(), pa.int64())),
])
NESTED_ROWS = [
    {"dec": decimal.Decimal("12.50"), "day": dt.date(2025, 3, 1),
     "at": dt.datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC), "tags": ["a", "b"],
     "pos": {"x": 1.0, "y": None}, "attrs": [("n", 3)]},
    {"dec": None, "day": None, "at": T0, "tags": None, "pos": None, "attrs": None},
]


@pytest.mark.parametrize("value_columns", ["flatten", "struct"])
def test_nested_types_are_cast_to_exactly_what_spark_checks(value_columns):
    schema = build_read_schema({"n": NESTED}, False, value_columns)
    out = to_spark_batch(typed_batch(NESTED, NESTED_ROWS), "n", schema)
    spark_checks(schema, out)
    rows = (out.column("value").to_pylist() if value_columns == "struct" else
            out.select([f.name for f in NESTED]).to_pylist())
    assert rows == NESTED_ROWS


def test_a_field_widened_after_load_is_cast_back_when_it_fits():
    old = pa.schema([pa.field("n", pa.int32())])
    new = pa.schema([pa.field("n", pa.int64()), pa.field("added", pa.string())])
    schema = build_read_schema({"s": old}, False)
    out = to_spark_batch(typed_batch(new, [{"n": 5, "added": "x"}]), "s", schema)
    spark_checks(schema, out)
    assert out.column("n").to_pylist() == [5]  # the new field waits for the next load()
    with pytest.raises(ReadSchemaError) as info:
        to_spark_batch(typed_batch(new, [{"n": 2**40, "added": None}]), "s", schema)
    assert str(info.value).startswith(
        "Stream 's': value field 'n' is now int64, which does not fit the query's column "
        "type int32 (")
    assert str(info.value).endswith(
        "The stream's schema changed after the query was loaded; load() again (restart a "
        "streaming query) to read it.")


def test_a_stream_without_a_read_field_fails_naming_it():
    schema = build_read_schema({"r": READINGS}, False)
    other = pa.schema([pa.field("sensorId", pa.string())])
    with pytest.raises(ReadSchemaError) as info:
        to_spark_batch(typed_batch(other, [{"sensorId": "s"}]), "late", schema)
    assert str(info.value) == (
        "Stream 'late' has no value field 'reading' that this query reads (its fields: "
        "sensorId); streams read together must have the same fields. Read it in a separate "
        "query.")


def test_untyped_batch_in_a_typed_read_and_the_reverse_fail_clearly():
    typed = build_read_schema({"r": READINGS}, False)
    with pytest.raises(ReadSchemaError) as info:
        to_spark_batch(stored_batch(), "plain", typed)
    assert str(info.value) == (
        "Stream 'plain' is untyped (binary value), but this query reads typed streams; "
        "streams read together must all be typed with compatible schemas, or all untyped.")
    with pytest.raises(ReadSchemaError) as info:
        to_spark_batch(typed_batch(READINGS, [{"sensorId": "s", "reading": 1.0}]), "r",
                       ReadSchema(False))
    assert str(info.value).startswith(
        "Stream 'r' is typed (its value is struct<sensorId: string not null, reading: "
        "double>), but this query reads untyped streams (binary value)")

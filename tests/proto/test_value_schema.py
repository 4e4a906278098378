"""Typed streams' value schemas (npstream.proto.value_schema, docs/typed-streams.md).

The broker, the client and the Spark connector all rely on these functions
agreeing with Spark: the DDL and JSON forms must round-trip exactly (the
broker compares versions with ``equals``), errors must name the position,
field, rule or message index the docs promise, and the value conversions
must be exact on the success path and name the first bad message otherwise.
"""

from __future__ import annotations

import cProfile
import datetime as dt
import json
import pstats
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.proto.value_schema import (
    IncompatibleSchemaError,
    SchemaError,
    ValueMismatchError,
    check_evolution,
    conform_batch,
    deserialize_schema,
    normalize_schema,
    parse_schema,
    serialize_schema,
    stored_schema,
    to_ddl,
    to_spark_json,
    value_sizes,
    value_struct,
)

TS = pa.timestamp("us", tz="UTC")


def one(data_type: pa.DataType, nullable: bool = True) -> pa.Schema:
    return pa.schema([pa.field("f", data_type, nullable=nullable)])


def spark_json(data_type: T.DataType, nullable: bool = True) -> str:
    """The JSON Spark itself writes for a one-field schema (df.schema.json())."""
    return T.StructType([T.StructField("f", data_type, nullable)]).json()


# --------------------------------------------------------------- types

# (DDL as written, canonical DDL, Arrow type, Spark type)
TYPES = [
    ("BOOLEAN", "BOOLEAN", pa.bool_(), T.BooleanType()),
    ("bool", "BOOLEAN", pa.bool_(), T.BooleanType()),
    ("TINYINT", "TINYINT", pa.int8(), T.ByteType()),
    ("byte", "TINYINT", pa.int8(), T.ByteType()),
    ("SMALLINT", "SMALLINT", pa.int16(), T.ShortType()),
    ("Short", "SMALLINT", pa.int16(), T.ShortType()),
    ("INT", "INT", pa.int32(), T.IntegerType()),
    ("integer", "INT", pa.int32(), T.IntegerType()),
    ("BIGINT", "BIGINT", pa.int64(), T.LongType()),
    ("long", "BIGINT", pa.int64(), T.LongType()),
    ("FLOAT", "FLOAT", pa.float32(), T.FloatType()),
    ("real", "FLOAT", pa.float32(), T.FloatType()),
    ("DOUBLE", "DOUBLE", pa.float64(), T.DoubleType()),
    ("DECIMAL(10,2)", "DECIMAL(10,2)", pa.decimal128(10, 2), T.DecimalType(10, 2)),
    ("decimal( 38 , 0 )", "DECIMAL(38,0)", pa.decimal128(38, 0), T.DecimalType(38, 0)),
    ("DECIMAL(5)", "DECIMAL(5,0)", pa.decimal128(5, 0), T.DecimalType(5, 0)),
    ("DECIMAL", "DECIMAL(10,0)", pa.decimal128(10, 0), T.DecimalType(10, 0)),
    ("NUMERIC(3,3)", "DECIMAL(3,3)", pa.decimal128(3, 3), T.DecimalType(3, 3)),
    ("STRING", "STRING", pa.string(), T.StringType()),
    ("BINARY", "BINARY", pa.binary(), T.BinaryType()),
    ("DATE", "DATE", pa.date32(), T.DateType()),
    ("TIMESTAMP", "TIMESTAMP", TS, T.TimestampType()),
    ("ARRAY<STRING>", "ARRAY<STRING>", pa.list_(pa.string()), T.ArrayType(T.StringType())),
    ("array<array<int>>", "ARRAY<ARRAY<INT>>", pa.list_(pa.list_(pa.int32())),
     T.ArrayType(T.ArrayType(T.IntegerType()))),
    ("ARRAY<INT NOT NULL>", "ARRAY<INT NOT NULL>",
     pa.list_(pa.field("item", pa.int32(), nullable=False)),
     T.ArrayType(T.IntegerType(), containsNull=False)),
    ("STRUCT<lat: DOUBLE, lon: DOUBLE NOT NULL>", "STRUCT<lat: DOUBLE, lon: DOUBLE NOT NULL>",
     pa.struct([("lat", pa.float64()), pa.field("lon", pa.float64(), nullable=False)]),
     T.StructType([T.StructField("lat", T.DoubleType()),
                   T.StructField("lon", T.DoubleType(), nullable=False)])),
    ("struct<a struct<b: date>>", "STRUCT<a: STRUCT<b: DATE>>",
     pa.struct([("a", pa.struct([("b", pa.date32())]))]),
     T.StructType([T.StructField("a", T.StructType([T.StructField("b", T.DateType())]))])),
    ("MAP<STRING, BIGINT>", "MAP<STRING, BIGINT>", pa.map_(pa.string(), pa.int64()),
     T.MapType(T.StringType(), T.LongType())),
    ("MAP<INT, ARRAY<TIMESTAMP>>", "MAP<INT, ARRAY<TIMESTAMP>>",
     pa.map_(pa.int32(), pa.list_(TS)), T.MapType(T.IntegerType(), T.ArrayType(T.TimestampType()))),
    ("MAP<DATE, STRING NOT NULL>", "MAP<DATE, STRING NOT NULL>",
     pa.map_(pa.date32(), pa.field("value", pa.string(), nullable=False)),
     T.MapType(T.DateType(), T.StringType(), valueContainsNull=False)),
]


@pytest.mark.parametrize(("ddl", "canonical", "arrow", "spark"), TYPES,
                         ids=[row[0] for row in TYPES])
@pytest.mark.parametrize("nullable", [True, False])
def test_each_type_in_ddl_and_spark_json(ddl, canonical, arrow, spark, nullable):
    """Every type parses from DDL and from Spark's own JSON to the same Arrow type, both ways."""
    expected = one(arrow, nullable)
    suffix = "" if nullable else " NOT NULL"
    parsed = parse_schema(f"f {ddl}{suffix}")
    assert parsed.equals(expected)
    assert to_ddl(parsed) == f"f {canonical}{suffix}"
    assert parse_schema(to_ddl(parsed)).equals(expected)
    # Spark's JSON for the type reads as the same schema, and ours is byte for byte Spark's.
    assert parse_schema(spark_json(spark, nullable)).equals(expected)
    ours = to_spark_json(parsed)
    assert ours == spark_json(spark, nullable)
    assert T.StructType.fromJson(json.loads(ours)).json() == ours
    assert parse_schema(ours).equals(expected)


FULL_DDL = ("sensorId STRING, reading DOUBLE NOT NULL, tags ARRAY<STRING>, "
            "loc STRUCT<lat: DOUBLE, lon: DOUBLE>, attrs MAP<STRING, BIGINT>, "
            "amount DECIMAL(10,2), day DATE, ts TIMESTAMP")
FULL = pa.schema([
    ("sensorId", pa.string()),
    pa.field("reading", pa.float64(), nullable=False),
    ("tags", pa.list_(pa.string())),
    ("loc", pa.struct([("lat", pa.float64()), ("lon", pa.float64())])),
    ("attrs", pa.map_(pa.string(), pa.int64())),
    ("amount", pa.decimal128(10, 2)),
    ("day", pa.date32()),
    ("ts", TS),
])


def test_full_schema_round_trips():
    assert parse_schema(FULL_DDL).equals(FULL)
    assert to_ddl(FULL) == FULL_DDL
    assert parse_schema(to_spark_json(FULL)).equals(FULL)
    assert deserialize_schema(serialize_schema(FULL)).equals(FULL)


@pytest.mark.parametrize("text", [
    "sensorId string, reading double not null",
    "  sensorId:String ,reading DOUBLE   NOT   NULL  ",
    "`sensorId` STRING COMMENT 'the sensor', reading DOUBLE NOT NULL COMMENT \"why\"",
    "struct<sensorId:string,reading:double not null>",
    "STRUCT<sensorId: STRING, reading: DOUBLE NOT NULL>",
])
def test_ddl_spellings(text):
    """Keywords are case-insensitive; colons, back quotes, comments, struct<...> as in Spark."""
    expected = pa.schema([("sensorId", pa.string()),
                          pa.field("reading", pa.float64(), nullable=False)])
    assert parse_schema(text).equals(expected)


@pytest.mark.parametrize(("name", "ddl_name"), [
    ("plain_Name1", "plain_Name1"),
    ("with space", "`with space`"),
    ("a.b", "`a.b`"),
    ("back`tick", "`back``tick`"),
    ("1starts_with_digit", "`1starts_with_digit`"),
    ("é", "`é`"),
    ("NOT", "NOT"),
    ("STRUCT", "STRUCT"),
])
def test_names_are_quoted_when_needed_and_round_trip(name, ddl_name):
    schema = pa.schema([pa.field(name, pa.int32(), nullable=False),
                        ("s", pa.struct([(name, pa.string())]))])
    ddl = to_ddl(schema)
    assert ddl == f"{ddl_name} INT NOT NULL, s STRUCT<{ddl_name}: STRING>"
    assert parse_schema(ddl).equals(schema)
    assert parse_schema(to_spark_json(schema)).equals(schema)


# --------------------------------------------------------------- parse errors

# (text, message part, field, position)
DDL_ERRORS = [
    ("", "schema is empty", None, 0),
    ("   ", "schema is empty", None, 0),
    ("a FOO", "unknown type 'FOO' at position 2 (field 'a')", "a", 2),
    ("a INT, b TIMESTAMP_NTZ", "unsupported type 'TIMESTAMP_NTZ' at position 9 (field 'b')",
     "b", 9),
    ("a STRUCT<b INT, c VARCHAR(3)>", "unsupported type 'VARCHAR' at position 18 (field 'a.c')",
     "a.c", 18),
    ("a ARRAY<STRUCT<x UNKNOWN>>", "unknown type 'UNKNOWN' at position 17 (field 'a.element.x')",
     "a.element.x", 17),
    ("a INT, a STRING", "duplicate field name 'a' at position 7", "a", 7),
    ("a INT, A STRING", "duplicate field name 'A' at position 7 (same as 'a')", "A", 7),
    ("s STRUCT<b INT, b INT>", "duplicate field name 's.b' at position 16", "s.b", 16),
    ("m MAP<STRING, STRUCT<x INT, x INT>>", "duplicate field name 'm.value.x' at position 28",
     "m.value.x", 28),
    ("a INT,", "expected a field name at position 6, found the end of the schema", None, 6),
    ("a INT b INT", "expected ',' or the end of the schema at position 6, found 'b'", None, 6),
    ("a", "expected a type at position 1, found the end of the schema (field 'a')", "a", 1),
    (", a INT", "expected a field name at position 0, found ','", None, 0),
    ("a ARRAY<INT", "expected '>' at position 11, found the end of the schema (field 'a')",
     "a", 11),
    ("a ARRAY INT", "expected '<' at position 8, found 'INT' (field 'a')", "a", 8),
    ("a INT NOT", "expected NULL after NOT at position 9", "a", 9),
    ("a INT NOT NULL NOT NULL", "expected ',' or the end of the schema at position 15", None, 15),
    ("a DECIMAL(40,2)", "DECIMAL(40,2) at position 2 (field 'a'): precision must be 1..38", "a",
     2),
    ("a DECIMAL(5,6)", "scale 0..precision", "a", 2),
    ("a DECIMAL(x)", "expected a number at position 10, found 'x' (field 'a')", "a", 10),
    ("m MAP<ARRAY<INT>, INT>", "MAP key at position 6 (field 'm.key') must be a primitive type",
     "m.key", 6),
    ("s STRUCT<>", "STRUCT with no fields at position 9 (field 's')", "s", 9),
    ("a INT, `b", "unterminated back-quoted name at position 7", None, 7),
    ("a INT, b# INT", "unexpected character '#' at position 8", None, 8),
    ("a INT COMMENT 5", "expected a quoted comment at position 14", "a", 14),
    ("`` INT", "empty field name at position 0", "", 0),
]


@pytest.mark.parametrize(("text", "message", "field", "position"), DDL_ERRORS,
                         ids=[row[0] or "empty" for row in DDL_ERRORS])
def test_ddl_errors_name_position_and_field(text, message, field, position):
    with pytest.raises(SchemaError) as caught:
        parse_schema(text)
    assert message in str(caught.value)
    assert caught.value.field == field
    assert caught.value.position == position
    assert not isinstance(caught.value, IncompatibleSchemaError)


def spark_field(name: str, data_type: Any, nullable: bool = True) -> dict[str, Any]:
    return {"name": name, "type": data_type, "nullable": nullable, "metadata": {}}


def struct_json(*fields: dict[str, Any]) -> str:
    return json.dumps({"type": "struct", "fields": list(fields)})


JSON_ERRORS = [
    ('{"type": "struct", "fields": [', "invalid JSON at position 30", None, 30),
    ('{"type": "struct"', "invalid JSON at position 17", None, 17),
    (struct_json(), "schema is empty", None, None),
    ('{"type": "array", "elementType": "long"}', "must be a Spark StructType", None, None),
    (struct_json(spark_field("a", "foo")), "unknown type 'foo' (field 'a')", "a", None),
    (struct_json(spark_field("a", "timestamp_ntz")), "unsupported type 'timestamp_ntz'", "a",
     None),
    (struct_json(spark_field("a", "char(3)")), "unsupported type 'char(3)'", "a", None),
    (struct_json(spark_field("a", "long"), spark_field("a", "string")),
     "duplicate field name 'a'", "a", None),
    (struct_json(spark_field("s", {"type": "struct", "fields": [
        spark_field("x", "long"), spark_field("X", "long")]})),
     "duplicate field name 's.X' (same as 's.x')", "s.X", None),
    (struct_json(spark_field("l", {"type": "array", "elementType": "interval",
                                   "containsNull": True})),
     "unsupported type 'interval' (field 'l.element')", "l.element", None),
    (struct_json(spark_field("m", {"type": "map", "keyType": {
        "type": "array", "elementType": "long", "containsNull": True},
        "valueType": "long", "valueContainsNull": True})),
     "MAP key (field 'm.key') must be a primitive type", "m.key", None),
    (struct_json(spark_field("d", "decimal(39,0)")), "precision must be 1..38", "d", None),
    (struct_json(spark_field("s", {"type": "struct", "fields": []})),
     "STRUCT with no fields (field 's')", "s", None),
    (struct_json(spark_field("a", "long", nullable="yes")), "'nullable' must be true or false",
     "a", None),
    (struct_json({"type": "long"}), "a field needs a 'name'", None, None),
    ('{"type": "struct"}', "a struct needs a 'fields' list", None, None),
]


@pytest.mark.parametrize(("text", "message", "field", "position"), JSON_ERRORS)
def test_json_errors_name_position_or_field(text, message, field, position):
    with pytest.raises(SchemaError) as caught:
        parse_schema(text)
    assert message in str(caught.value)
    assert caught.value.field == field
    assert caught.value.position == position


def test_json_metadata_is_ignored_and_defaults_follow_spark():
    text = struct_json(
        {"name": "a", "type": "long", "nullable": False, "metadata": {"comment": "x"}},
        {"name": "b", "type": "decimal"},
        {"name": "c", "type": {"type": "array", "elementType": "string"}},
    )
    assert parse_schema(text).equals(pa.schema([
        pa.field("a", pa.int64(), nullable=False),
        ("b", pa.decimal128(10, 0)),
        ("c", pa.list_(pa.string())),
    ]))


# --------------------------------------------------------------- normalize / serialize


@pytest.mark.parametrize(("given", "canonical"), [
    (pa.large_string(), pa.string()),
    (pa.string_view(), pa.string()),
    (pa.large_binary(), pa.binary()),
    (pa.timestamp("ns"), TS),
    (pa.timestamp("s", tz="Europe/Paris"), TS),
    (pa.timestamp("ms", tz="UTC"), TS),
    (pa.date64(), pa.date32()),
    (pa.decimal256(20, 4), pa.decimal128(20, 4)),
    (pa.large_list(pa.large_string()), pa.list_(pa.string())),
    (pa.list_(pa.field("element", pa.int32(), nullable=False)),
     pa.list_(pa.field("item", pa.int32(), nullable=False))),
    (pa.struct([("a", pa.large_list(pa.timestamp("ns")))]), pa.struct([("a", pa.list_(TS))])),
    (pa.map_(pa.large_string(), pa.large_binary()), pa.map_(pa.string(), pa.binary())),
])
def test_normalize_schema_maps_to_canonical_types(given, canonical):
    normalized = normalize_schema(pa.schema([pa.field("f", given, nullable=False)],
                                            metadata={"k": "v"}))
    assert normalized.equals(one(canonical, nullable=False))
    assert normalized.metadata is None
    assert parse_schema(to_ddl(normalized)).equals(normalized)


def test_normalize_keeps_canonical_schemas():
    for *_, arrow, _spark in TYPES:
        assert normalize_schema(one(arrow)).equals(one(arrow))
    assert normalize_schema(FULL).equals(FULL)


@pytest.mark.parametrize(("schema", "message", "field"), [
    (one(pa.uint8()), "unsupported type uint8 (field 'f')", "f"),
    (one(pa.float16()), "unsupported type halffloat (field 'f')", "f"),
    (one(pa.time32("s")), "unsupported type time32[s] (field 'f')", "f"),
    (one(pa.null()), "unsupported type null (field 'f')", "f"),
    (one(pa.dictionary(pa.int32(), pa.string())), "unsupported type", "f"),
    (one(pa.struct([("a", pa.list_(pa.uint64()))])), "(field 'f.a.element')", "f.a.element"),
    (one(pa.map_(pa.string(), pa.duration("s"))), "(field 'f.value')", "f.value"),
    (one(pa.map_(pa.struct([("a", pa.int32())]), pa.int32())),
     "MAP key (field 'f.key') must be a primitive type", "f.key"),
    (one(pa.struct([])), "STRUCT with no fields (field 'f')", "f"),
    (one(pa.decimal256(40, 0)), "precision must be 1..38", "f"),
    (pa.schema([("a", pa.int32()), ("A", pa.int64())]), "duplicate field name 'A'", "A"),
    (pa.schema([]), "schema is empty", None),
])
def test_normalize_refuses_unsupported(schema, message, field):
    with pytest.raises(SchemaError) as caught:
        normalize_schema(schema)
    assert message in str(caught.value)
    assert caught.value.field == field


def test_serialize_round_trip_and_garbage():
    data = serialize_schema(FULL)
    assert isinstance(data, bytes)
    assert deserialize_schema(data).equals(FULL)
    assert pa.ipc.read_schema(pa.py_buffer(data)).equals(FULL)  # a plain Arrow IPC message
    with pytest.raises(SchemaError, match="not an Arrow IPC schema message"):
        deserialize_schema(b"not a schema")
    with pytest.raises(SchemaError, match="unsupported type uint8"):
        deserialize_schema(one(pa.uint8()).serialize().to_pybytes())


def test_stored_schema_replaces_only_value():
    stored = stored_schema(FULL)
    assert stored.names == MESSAGE_SCHEMA.names
    for name in MESSAGE_SCHEMA.names:
        if name != "value":
            assert stored.field(name).equals(MESSAGE_SCHEMA.field(name))
    assert stored.field("value").equals(pa.field("value", pa.struct(list(FULL)), nullable=False))


# --------------------------------------------------------------- evolution

ALLOWED = [
    ("a INT", "a INT"),
    ("a INT", "a INT, b STRING"),
    ("a INT", "b STRING, a INT"),  # order does not matter
    ("a TINYINT", "a SMALLINT"),
    ("a TINYINT", "a BIGINT"),
    ("a SMALLINT", "a INT"),
    ("a INT", "a BIGINT"),
    ("a FLOAT", "a DOUBLE"),
    ("a DECIMAL(10,2)", "a DECIMAL(12,2)"),
    ("a INT NOT NULL", "a INT"),
    ("a INT NOT NULL", "a BIGINT"),
    ("s STRUCT<x INT>", "s STRUCT<x BIGINT, y ARRAY<STRING>>"),
    ("s STRUCT<x STRUCT<y INT>>", "s STRUCT<x STRUCT<z STRING, y INT>>"),
    ("l ARRAY<INT>", "l ARRAY<BIGINT>"),
    ("l ARRAY<INT NOT NULL>", "l ARRAY<INT>"),
    ("l ARRAY<STRUCT<p FLOAT>>", "l ARRAY<STRUCT<p DOUBLE, q DATE>>"),
    ("m MAP<STRING, INT>", "m MAP<STRING, BIGINT>"),
    ("m MAP<STRING, INT NOT NULL>", "m MAP<STRING, INT>"),
    ("m MAP<STRING, STRUCT<v DECIMAL(5,1)>>", "m MAP<STRING, STRUCT<v DECIMAL(6,1), w INT>>"),
]


@pytest.mark.parametrize(("old", "new"), ALLOWED)
def test_evolution_allowed(old, new):
    check_evolution(parse_schema(old), parse_schema(new))


WIDEN = "rule: a type can only be widened"
REFUSED = [
    ("a INT, b INT", "a INT", "b",
     "field 'b' was removed (rule: fields cannot be removed or renamed)"),
    ("a INT", "A INT", "a", "field 'a' was removed"),
    ("a INT", "a INT, b INT NOT NULL", "b",
     "field 'b' was added as NOT NULL (rule: added fields must be nullable)"),
    ("a INT", "a INT NOT NULL", "a",
     "field 'a' became NOT NULL (rule: NOT NULL can be dropped, never added)"),
    ("a BIGINT", "a INT", "a", f"field 'a' changed from BIGINT to INT ({WIDEN}"),
    ("a INT", "a DOUBLE", "a", f"field 'a' changed from INT to DOUBLE ({WIDEN}"),
    ("a DOUBLE", "a FLOAT", "a", f"changed from DOUBLE to FLOAT ({WIDEN}"),
    ("a INT", "a STRING", "a", f"changed from INT to STRING ({WIDEN}"),
    ("a DATE", "a TIMESTAMP", "a", f"changed from DATE to TIMESTAMP ({WIDEN}"),
    ("a DECIMAL(10,2)", "a DECIMAL(12,3)", "a",
     f"changed from DECIMAL(10,2) to DECIMAL(12,3) ({WIDEN}"),
    ("a DECIMAL(10,2)", "a DECIMAL(9,2)", "a", WIDEN),
    ("a INT", "a ARRAY<INT>", "a", f"changed from INT to ARRAY<INT> ({WIDEN}"),
    ("s STRUCT<x INT>", "s STRUCT<y INT>", "s.x", "field 's.x' was removed"),
    ("s STRUCT<x INT>", "s STRUCT<x INT, y INT NOT NULL>", "s.y",
     "field 's.y' was added as NOT NULL"),
    ("s STRUCT<x STRUCT<y BIGINT>>", "s STRUCT<x STRUCT<y INT>>", "s.x.y",
     f"field 's.x.y' changed from BIGINT to INT ({WIDEN}"),
    ("l ARRAY<INT>", "l ARRAY<INT NOT NULL>", "l.element",
     "field 'l.element' became NOT NULL"),
    ("l ARRAY<STRUCT<p INT>>", "l ARRAY<STRUCT<q INT>>", "l.element.p",
     "field 'l.element.p' was removed"),
    ("m MAP<STRING, BIGINT>", "m MAP<STRING, INT>", "m.value",
     f"field 'm.value' changed from BIGINT to INT ({WIDEN}"),
    ("m MAP<STRING, INT>", "m MAP<STRING, INT NOT NULL>", "m.value",
     "field 'm.value' became NOT NULL"),
    ("m MAP<INT, INT>", "m MAP<BIGINT, INT>", "m.key",
     "field 'm.key' changed from INT to BIGINT (rule: MAP keys cannot change)"),
    ("m MAP<STRING, STRUCT<v INT>>", "m MAP<STRING, STRUCT<v INT NOT NULL>>", "m.value.v",
     "field 'm.value.v' became NOT NULL"),
]


@pytest.mark.parametrize(("old", "new", "field", "message"), REFUSED)
def test_evolution_refused(old, new, field, message):
    with pytest.raises(IncompatibleSchemaError) as caught:
        check_evolution(parse_schema(old), parse_schema(new))
    assert message in str(caught.value)
    assert caught.value.field == field
    assert caught.value.rule in str(caught.value)
    assert isinstance(caught.value, SchemaError)


# --------------------------------------------------------------- conform_batch


def stored_batch(value_schema: pa.Schema, values: list[dict[str, Any]]) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_arrays([
        pa.array(range(10, 10 + n), pa.int64()),
        pa.array([f"id{i}" for i in range(n)]),
        pa.array([b"k"] * n, pa.binary()),
        pa.array(values, pa.struct(list(value_schema))),
        pa.array([1000 * i for i in range(n)], pa.timestamp("ms", tz="UTC")),
        pa.array([[("h", b"v")]] * n, MESSAGE_SCHEMA.field("headers").type),
    ], schema=stored_schema(value_schema))


V1 = parse_schema("a INT NOT NULL, f FLOAT, s STRUCT<x SMALLINT>, l ARRAY<STRUCT<p INT>>, "
                  "m MAP<STRING, DECIMAL(5,2)>")
V2 = parse_schema("a BIGINT, f DOUBLE, s STRUCT<x INT, y STRING>, "
                  "l ARRAY<STRUCT<p BIGINT, q BOOLEAN>>, m MAP<STRING, DECIMAL(7,2)>, b DATE")
V3 = parse_schema("b DATE, a BIGINT, c STRING, f DOUBLE, s STRUCT<x BIGINT, y STRING>, "
                  "l ARRAY<STRUCT<p BIGINT, q BOOLEAN>>, m MAP<STRING, DECIMAL(7,2)>")


def test_conform_batch_across_versions():
    check_evolution(V1, V2)
    check_evolution(V2, V3)
    rows = [
        {"a": 1, "f": 1.5, "s": {"x": 7}, "l": [{"p": 1}, None, {"p": None}],
         "m": [("k", Decimal("1.25"))]},
        {"a": 2, "f": None, "s": None, "l": None, "m": None},
        {"a": 3, "f": 2.0, "s": {"x": None}, "l": [], "m": []},
    ]
    old = stored_batch(V1, rows)
    for target_schema in (V2, V3):
        target = stored_schema(target_schema)
        out = conform_batch(old, target)
        out.validate(full=True)
        assert out.schema.equals(target)
        for name in MESSAGE_SCHEMA.names:
            if name != "value":
                assert out.column(name).equals(old.column(name))
        values = out.column("value").to_pylist()
        assert [v["a"] for v in values] == [1, 2, 3]
        assert [v["f"] for v in values] == [1.5, None, 2.0]
        assert [v["b"] for v in values] == [None, None, None]
        assert values[0]["s"] == {"x": 7, "y": None}
        assert values[1]["s"] is None
        assert values[0]["l"] == [{"p": 1, "q": None}, None, {"p": None, "q": None}]
        assert values[1]["l"] is None and values[2]["l"] == []
        assert values[0]["m"] == [("k", Decimal("1.25"))]
    # the latest version's batch is returned as it is
    latest = stored_batch(V3, [{"a": 1, "b": dt.date(2024, 1, 2)}])
    assert conform_batch(latest, stored_schema(V3)) is latest
    # a V2 batch to V3: only the order and the added field change
    middle = conform_batch(stored_batch(V2, [{"a": 5, "b": dt.date(2024, 1, 2)}]),
                           stored_schema(V3))
    assert middle.column("value").to_pylist() == [
        {"b": dt.date(2024, 1, 2), "a": 5, "c": None, "f": None, "s": None, "l": None, "m": None}]


def test_conform_batch_of_a_slice():
    rows = [{"a": i, "l": [{"p": i}] if i % 2 else None} for i in range(10)]
    old = stored_batch(V1, rows).slice(3, 4)
    out = conform_batch(old, stored_schema(V2))
    out.validate(full=True)
    assert [v["a"] for v in out.column("value").to_pylist()] == [3, 4, 5, 6]
    assert [v["l"] for v in out.column("value").to_pylist()] == [
        [{"p": 3, "q": None}], None, [{"p": 5, "q": None}], None]


# --------------------------------------------------------------- value_struct: structs


SIMPLE = parse_schema("id BIGINT NOT NULL, name STRING, score DOUBLE, tags ARRAY<STRING>, "
                      "pos STRUCT<x INT NOT NULL, y INT>, attrs MAP<STRING, INT NOT NULL>")
SIMPLE_TYPE = pa.struct(list(SIMPLE))


def test_value_struct_exact_struct_is_kept():
    arr = pa.array([{"id": 1, "name": "a", "pos": {"x": 1, "y": None}, "attrs": [("k", 1)]},
                    {"id": 2}], SIMPLE_TYPE)
    out = value_struct(arr, SIMPLE)
    assert out.type == SIMPLE_TYPE and out.equals(arr)
    assert out.null_count == 0
    chunked = pa.chunked_array([arr.slice(0, 1), arr.slice(1)])
    assert value_struct(chunked, SIMPLE).equals(arr)
    assert value_struct(pa.chunked_array([], SIMPLE_TYPE), SIMPLE).type == SIMPLE_TYPE


def test_value_struct_matches_by_name_and_casts_safely():
    source = pa.array(
        [{"attrs": [("k", 5)], "score": 3, "id": 7, "tags": ["t"], "pos": {"y": 2, "x": 1}},
         {"attrs": None, "score": None, "id": 8, "tags": None, "pos": None}],
        pa.struct([("attrs", pa.map_(pa.large_string(), pa.int8())), ("score", pa.int32()),
                   ("id", pa.int32()), ("tags", pa.large_list(pa.large_string())),
                   ("pos", pa.struct([("y", pa.int64()), ("x", pa.int8())]))]))
    out = value_struct(source, SIMPLE)
    out.validate(full=True)
    assert out.type == SIMPLE_TYPE
    assert out.to_pylist() == [
        {"id": 7, "name": None, "score": 3.0, "tags": ["t"], "pos": {"x": 1, "y": 2},
         "attrs": [("k", 5)]},
        {"id": 8, "name": None, "score": None, "tags": None, "pos": None, "attrs": None},
    ]


def test_value_struct_of_a_sliced_struct_with_hidden_values():
    """Values behind nulls (a sliced array, a null struct) are neither checked nor kept."""
    arr = pa.array([{"id": 1, "pos": {"x": 1}}, {"id": 2, "pos": None}, {"id": 3, "pos": None}],
                   pa.struct([("id", pa.int64()), ("pos", pa.struct([("x", pa.int32())]))]))
    out = value_struct(arr.slice(1), SIMPLE)
    assert [v["pos"] for v in out.to_pylist()] == [None, None]
    assert [v["id"] for v in out.to_pylist()] == [2, 3]


def mismatch(values: Any, schema: pa.Schema = SIMPLE) -> ValueMismatchError:
    with pytest.raises(ValueMismatchError) as caught:
        value_struct(values, schema)
    return caught.value


def struct_of(rows: list[dict[str, Any]], fields: list[Any]) -> pa.StructArray:
    return pa.array(rows, pa.struct(fields))


# (values, index, field, expected, problem part)
STRUCT_ERRORS = [
    (struct_of([{"id": 1, "zz": 1}], [("id", pa.int64()), ("zz", pa.int8())]),
     0, "zz", SIMPLE_TYPE, "is not in the schema"),
    (struct_of([{"name": "a"}], [("name", pa.string())]), 0, "id", "BIGINT",
     "is missing (NOT NULL)"),
    (struct_of([{"id": 1}, {"id": 2}, {"id": None}], [("id", pa.int64())]), 2, "id", "BIGINT",
     "is null (NOT NULL)"),
    (struct_of([{"id": 1}, {"id": 2}, None], [("id", pa.int64())]), 2, "", SIMPLE_TYPE,
     "is null"),
    (struct_of([{"id": "1"}, {"id": "2"}], [("id", pa.string())]), 0, "id", "BIGINT",
     "is STRING"),
    (struct_of([{"id": 1, "score": Decimal("2.0")}, {"id": 2, "score": Decimal("0.5")}],
               [("id", pa.int64()), ("score", pa.decimal128(3, 1))]), 0, "score", "DOUBLE",
     "is DECIMAL(3,1)"),
    (struct_of([{"id": 1, "pos": {"x": 1}}, {"id": 2, "pos": {"x": 2**40}}],
               [("id", pa.int64()), ("pos", pa.struct([("x", pa.int64())]))]),
     1, "pos.x", "INT", "cannot be converted"),
    (struct_of([{"id": 1, "pos": {"x": 1}}, {"id": 2, "pos": {"y": 2}}],
               [("id", pa.int64()), ("pos", pa.struct([("x", pa.int64()), ("y", pa.int64())]))]),
     1, "pos.x", "INT", "is null (NOT NULL)"),
    (struct_of([{"id": 1, "pos": {"y": 1}}],
               [("id", pa.int64()), ("pos", pa.struct([("y", pa.int64())]))]),
     0, "pos.x", "INT", "is missing (NOT NULL)"),
    (struct_of([{"id": 1, "attrs": [("a", 1)]}, {"id": 2, "attrs": [("b", 1), ("c", None)]}],
               [("id", pa.int64()), ("attrs", pa.map_(pa.string(), pa.int64()))]),
     1, "attrs.value", "INT", "is null (NOT NULL)"),
    (struct_of([{"id": 1, "tags": [1]}], [("id", pa.int64()), ("tags", pa.list_(pa.int64()))]),
     0, "tags.element", "STRING", "is BIGINT"),
    (struct_of([{"id": 1, "tags": "x"}], [("id", pa.int64()), ("tags", pa.string())]),
     0, "tags", "ARRAY<STRING>", "is STRING"),
    (pa.array([1, 2]), 0, "", SIMPLE_TYPE, "not a struct or JSON objects"),
]


@pytest.mark.parametrize(("values", "index", "field", "expected", "problem"), STRUCT_ERRORS)
def test_value_struct_struct_errors(values, index, field, expected, problem):
    error = mismatch(values)
    expected_ddl = expected if isinstance(expected, str) else struct_ddl(expected)
    assert (error.index, error.field, error.expected) == (index, field, expected_ddl)
    assert problem in str(error)
    assert str(error).startswith(f"message {index}: ")
    assert str(error).endswith(f"; expected {expected_ddl}")


def struct_ddl(struct_type: pa.DataType) -> str:
    """STRUCT<a: T, ...> for the schema's struct, via a one-field schema's DDL."""
    ddl = to_ddl(pa.schema([pa.field("v", struct_type)]))
    return ddl[len("v "):]


def test_value_struct_first_bad_message_wins_across_fields():
    """Two fields fail at different messages: the earlier message is reported."""
    n = 1000
    ids: list[int | None] = list(range(n))
    ids[900] = None
    xs: list[int] = [1] * n
    xs[400] = 2**40
    values = pa.StructArray.from_arrays(
        [pa.array(ids, pa.int64()), pa.StructArray.from_arrays([pa.array(xs)], names=["x"])],
        names=["id", "pos"])
    error = mismatch(values)
    assert (error.index, error.field) == (400, "pos.x")
    xs[400] = 1
    values = pa.StructArray.from_arrays(
        [pa.array(ids, pa.int64()), pa.StructArray.from_arrays([pa.array(xs)], names=["x"])],
        names=["id", "pos"])
    assert (mismatch(values).index, mismatch(values).field) == (900, "id")


def test_value_struct_nested_list_error_names_the_message():
    schema = parse_schema("l ARRAY<STRUCT<p INT NOT NULL>>")
    rows = [{"l": [{"p": i}, {"p": i}]} for i in range(100)]
    rows[57]["l"][1]["p"] = None
    error = mismatch(pa.array(rows, pa.struct([("l", pa.list_(pa.struct([("p", pa.int64())])))])),
                     schema)
    assert (error.index, error.field, error.expected) == (57, "l.element.p", "INT")
    rows[57]["l"][1]["p"] = 1
    rows[80]["l"][0]["p"] = 2**33
    error = mismatch(pa.array(rows, pa.struct([("l", pa.list_(pa.struct([("p", pa.int64())])))])),
                     schema)
    assert (error.index, error.field) == (80, "l.element.p")


# --------------------------------------------------------------- value_struct: JSON


def json_values(rows: list[Any]) -> pa.Array:
    return pa.array([json.dumps(row).encode() for row in rows], pa.binary())


def test_value_struct_from_json_every_type():
    rows = [
        {"sensorId": "s1", "reading": 21.5, "tags": ["a", None], "loc": {"lat": 1, "lon": 2.5},
         "attrs": {"x": 1, "y": None}, "amount": "12.34", "day": "2024-01-02",
         "ts": "2024-01-02T03:04:05.123456Z"},
        {"reading": 3},
        {"reading": -1e10, "loc": None, "attrs": {}, "amount": 5, "tags": [],
         "ts": "2024-01-02 03:04:05+01:00"},
    ]
    out = value_struct(json_values(rows), FULL)
    out.validate(full=True)
    assert out.type == pa.struct(list(FULL))
    assert out.null_count == 0
    utc = dt.UTC
    assert [{k: v for k, v in row.items() if v is not None} for row in out.to_pylist()] == [
        {"sensorId": "s1", "reading": 21.5, "tags": ["a", None], "loc": {"lat": 1.0, "lon": 2.5},
         "attrs": [("x", 1), ("y", None)], "amount": Decimal("12.34"),
         "day": dt.date(2024, 1, 2), "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=utc)},
        {"reading": 3.0},
        {"reading": -1e10, "tags": [], "attrs": [], "amount": Decimal("5.00"),
         "ts": dt.datetime(2024, 1, 2, 2, 4, 5, tzinfo=utc)},
    ]
    # the same from text, from a chunked column and from pretty-printed JSON
    text = pa.array([json.dumps(row) for row in rows], pa.string())
    assert value_struct(text, FULL).equals(out)
    assert value_struct(text.cast(pa.large_string()), FULL).equals(out)
    assert value_struct(text.cast(pa.large_binary()), FULL).equals(out)
    assert value_struct(pa.chunked_array([text[:1], text[1:]]), FULL).equals(out)
    pretty = pa.array([json.dumps(row, indent=2).encode() for row in rows])
    assert value_struct(pretty, FULL).equals(out)


def test_value_struct_from_json_map_keys_and_binary():
    schema = parse_schema("m MAP<INT, DATE>, b BINARY, n MAP<STRING, MAP<BOOLEAN, STRING>>")
    out = value_struct(json_values([
        {"m": {"1": "2024-01-02", "-5": None}, "b": "h\u00e9", "n": {"a": {"true": "t"}}}]), schema)
    assert out.to_pylist() == [{"m": [(1, dt.date(2024, 1, 2)), (-5, None)],
                                "b": "h\u00e9".encode(), "n": [("a", [(True, "t")])]}]


def test_value_struct_from_json_empty():
    assert value_struct(pa.array([], pa.binary()), FULL).type == pa.struct(list(FULL))


FULL_DDL_TYPE = "STRUCT<" + FULL_DDL.replace("sensorId STRING", "sensorId: STRING").replace(
    "reading DOUBLE", "reading: DOUBLE").replace("tags ARRAY", "tags: ARRAY").replace(
    "loc STRUCT", "loc: STRUCT").replace("attrs MAP", "attrs: MAP").replace(
    "amount DECIMAL", "amount: DECIMAL").replace("day DATE", "day: DATE").replace(
    "ts TIMESTAMP", "ts: TIMESTAMP") + ">"

# (bad message, field, expected, problem part)
JSON_ERRORS_AT = [
    (b'{"reading": "x"}', "reading", "DOUBLE", 'is "x"'),
    (b'{"reading": 1, "extra": 1}', "extra", FULL_DDL_TYPE, "is not in the schema"),
    (b'{"reading": 1, "loc": {"lat": 1, "alt": 2}}', "loc.alt", "STRUCT<lat: DOUBLE, lon: DOUBLE>",
     "is not in the schema"),
    (b'{"sensorId": "s"}', "reading", "DOUBLE", "is null (NOT NULL)"),
    (b'{"sensorId": "s", "reading": null}', "reading", "DOUBLE", "is null (NOT NULL)"),
    (b'{"reading": 1, "tags": "a"}', "tags", "ARRAY<STRING>", 'is "a"'),
    (b'{"reading": 1, "tags": ["a", 1]}', "tags.element", "STRING", "is 1"),
    (b'{"reading": 1, "loc": [1, 2]}', "loc", "STRUCT<lat: DOUBLE, lon: DOUBLE>", "is [1, 2]"),
    (b'{"reading": 1, "loc": {"lat": "n"}}', "loc.lat", "DOUBLE", 'is "n"'),
    (b'{"reading": 1, "attrs": {"a": "b"}}', "attrs.value", "BIGINT", 'is "b"'),
    (b'{"reading": 1, "attrs": [1]}', "attrs", "MAP<STRING, BIGINT>", "is [1]"),
    (b'{"reading": 1, "amount": 123456789.5}', "amount", "DECIMAL(10,2)", "cannot be converted"),
    (b'{"reading": 1, "amount": 1234567890.5}', "amount", "DECIMAL(10,2)", "cannot be converted"),
    (b'{"reading": 1, "amount": 1.234}', "amount", "DECIMAL(10,2)", "is 1.234"),
    (b'{"reading": 1, "day": "2024-13-01"}', "day", "DATE", "cannot be converted"),
    (b'{"reading": 1, "day": 19000}', "day", "DATE", "is 19000"),
    (b'{"reading": 1, "ts": "yesterday"}', "ts", "TIMESTAMP", 'is "yesterday"'),
    (b'{"reading": 1, "ts": 1700000000}', "ts", "TIMESTAMP", "is 1700000000"),
    (b'[1, 2]', "", FULL_DDL_TYPE, "is not a JSON object"),
    (b'"text"', "", FULL_DDL_TYPE, "is not a JSON object"),
    (b'null', "", FULL_DDL_TYPE, "is not a JSON object"),
    (b'', "", FULL_DDL_TYPE, "is not valid JSON"),
    (b'   ', "", FULL_DDL_TYPE, "is not valid JSON"),
    (b'{"reading": 1', "", FULL_DDL_TYPE, "is not valid JSON"),
    (b'{"reading": 1}{"reading": 2}', "", FULL_DDL_TYPE, "is not valid JSON"),
    (b'{"reading": 1}\n{"reading": 2}', "", FULL_DDL_TYPE, "is not valid JSON"),
    (b'{"reading": "a\nb"}', "", FULL_DDL_TYPE, "is not valid JSON"),
    (b'\xff', "", FULL_DDL_TYPE, "is not valid JSON"),
]


@pytest.mark.parametrize(("bad", "field", "expected", "problem"), JSON_ERRORS_AT,
                         ids=[row[0].decode(errors="replace") or "empty" for row in JSON_ERRORS_AT])
@pytest.mark.parametrize("at", [0, 3])
def test_value_struct_json_errors(bad, field, expected, problem, at):
    good = [b'{"reading": 1}', b'{"reading": 2, "tags": ["x"]}', b'{"reading": 3}']
    messages = [*good[:at], bad, *good]
    error = mismatch(pa.array(messages, pa.binary()), FULL)
    assert (error.index, error.field, error.expected) == (at, field, expected)
    assert problem in str(error)
    assert str(error).startswith(f"message {at}: ")


def test_value_struct_json_null_message():
    error = mismatch(pa.array([b'{"reading": 1}', None], pa.binary()), FULL)
    assert (error.index, error.field) == (1, "")
    assert "is not a JSON object (null)" in str(error)


@pytest.mark.parametrize(("bad", "field"), [
    (b'{"sensorId": "s", "reading": "x"}', "reading"),
    (b'{"reading": 1, "surprise": true}', "surprise"),
    (b'{"sensorId": "no reading"}', "reading"),
    (b'[]', ""),
    (b'{"reading": 1,', ""),
])
def test_value_struct_json_bad_row_in_a_large_request(bad, field):
    """The bad message at index 70,000 of 100,000 is found and named exactly."""
    n = 100_000
    messages = [f'{{"sensorId": "s{i % 7}", "reading": {i}.5, "ts": "2024-01-02T00:00:00Z"}}'
                .encode() for i in range(n)]
    messages[70_000] = bad
    messages[90_000] = b"[]"  # a later bad message does not hide the first
    error = mismatch(pa.array(messages, pa.binary()), FULL)
    assert (error.index, error.field) == (70_000, field)


def test_value_struct_json_not_null_before_a_parse_error_is_reported_first():
    messages = [b'{"reading": 1}'] * 1000
    messages[300] = b'{"sensorId": "no reading"}'  # reads, but breaks NOT NULL
    messages[600] = b'{"reading": "x"}'  # does not read
    error = mismatch(pa.array(messages, pa.binary()), FULL)
    assert (error.index, error.field) == (300, "reading")
    messages[300] = b'{"reading": 1, "day": "2024-02-30"}'  # reads, but is no date
    error = mismatch(pa.array(messages, pa.binary()), FULL)
    assert (error.index, error.field) == (300, "day")


def test_value_struct_struct_and_json_agree():
    """The struct path and the JSON path give the same struct for the same records."""
    rows = [{"id": i, "name": f"n{i}" if i % 3 else None, "score": i / 4,
             "tags": [str(i)] * (i % 3), "pos": {"x": i, "y": None} if i % 2 else None,
             "attrs": {"k": i} if i % 5 else None} for i in range(50)]
    from_json = value_struct(json_values(rows), SIMPLE)
    arrow_rows = [{**row, "attrs": list(row["attrs"].items()) if row["attrs"] else None}
                  for row in rows]
    assert from_json.equals(value_struct(pa.array(arrow_rows, SIMPLE_TYPE), SIMPLE))


FIVE = parse_schema("sensorId STRING, reading DOUBLE NOT NULL, count BIGINT, ok BOOLEAN, "
                    "ts TIMESTAMP")


def python_calls(func: Any) -> int:
    """Python-level function calls ``func()`` makes (C code such as pyarrow's is not counted)."""
    profile = cProfile.Profile()
    profile.enable()
    func()
    profile.disable()
    return pstats.Stats(profile).total_calls  # type: ignore[attr-defined]


def five_fields(n: int) -> tuple[pa.StructArray, pa.Array]:
    """n rows of FIVE as a struct column and as JSON objects in bytes."""
    ids = np.arange(n)
    values = pa.StructArray.from_arrays([
        pa.array(np.char.add("s", (ids % 100).astype(str)).astype(object), pa.large_string()),
        pa.array(ids * 0.5),
        pa.array(ids.astype(np.int32)),
        pa.array(ids % 2 == 0),
        pa.array(ids * 1_000_000, pa.timestamp("ns")),
    ], names=["sensorId", "reading", "count", "ok", "ts"])
    text = pa.array([
        f'{{"sensorId":"s{i % 100}","reading":{i * 0.5},"count":{i},"ok":{"true" if i % 2 == 0 else "false"},"ts":"2024-01-02T03:04:05.123456Z"}}'  # noqa: E501
        for i in range(n)], pa.binary())
    return values, text


def test_value_struct_and_sizes_make_no_python_call_per_row():
    """No per-row Python on the success path: 100x the rows, the same Python calls.

    (Speed itself is measured by bench/broker.py's typed-stream rows, not here.)
    """
    small_values, small_text = five_fields(1_000)
    big_values, big_text = five_fields(100_000)
    typed = value_struct(big_values, FIVE)
    assert typed.type == pa.struct(list(FIVE))
    parsed = value_struct(big_text, FIVE)
    assert parsed.field("count").equals(typed.field("count"))
    assert parsed.field("sensorId").equals(typed.field("sensorId"))
    for small, big in ((lambda: value_struct(small_values, FIVE),
                        lambda: value_struct(big_values, FIVE)),
                       (lambda: value_struct(small_text, FIVE),
                        lambda: value_struct(big_text, FIVE)),
                       (lambda: value_sizes(value_struct(small_values, FIVE)),
                        lambda: value_sizes(typed))):
        assert python_calls(big) <= python_calls(small) + 20


# --------------------------------------------------------------- value_sizes

SIZED = parse_schema(
    "b BOOLEAN, i8 TINYINT, i16 SMALLINT, i32 INT, i64 BIGINT, f FLOAT, d DOUBLE, "
    "dec DECIMAL(10,2), s STRING, bin BINARY, day DATE, ts TIMESTAMP, l ARRAY<STRING>, "
    "ll ARRAY<ARRAY<INT>>, st STRUCT<x BIGINT, y STRING, z STRUCT<w BOOLEAN>>, "
    "m MAP<STRING, ARRAY<DOUBLE>>, lst ARRAY<STRUCT<p INT, q BINARY>>")

WIDTHS = {pa.bool_(): 1, pa.int8(): 1, pa.int16(): 2, pa.int32(): 4, pa.int64(): 8,
          pa.float32(): 4, pa.float64(): 8, pa.date32(): 4, TS: 8}


def reference_size(value: Any, t: pa.DataType) -> int:
    """One value's size from its Python form: the rule of value_sizes, row by row."""
    if value is None:
        return 0
    if pa.types.is_struct(t):
        return sum(reference_size(value.get(t.field(i).name), t.field(i).type)
                   for i in range(t.num_fields))
    if pa.types.is_map(t):
        return sum(reference_size(k, t.key_type) + reference_size(v, t.item_type)
                   for k, v in value)
    if pa.types.is_list(t):
        return sum(reference_size(item, t.value_type) for item in value)
    if pa.types.is_decimal(t):
        return 16
    if pa.types.is_string(t):
        return len(value.encode())
    if pa.types.is_binary(t):
        return len(value)
    return WIDTHS[t]


def strategy_for(t: pa.DataType) -> st.SearchStrategy[Any]:
    if pa.types.is_struct(t):
        return st.none() | st.fixed_dictionaries(
            {t.field(i).name: strategy_for(t.field(i).type) for i in range(t.num_fields)})
    if pa.types.is_map(t):
        return st.none() | st.dictionaries(st.text(max_size=4), strategy_for(t.item_type),
                                           max_size=3).map(lambda d: list(d.items()))
    if pa.types.is_list(t):
        return st.none() | st.lists(strategy_for(t.value_type), max_size=3)
    base: st.SearchStrategy[Any]
    if t == pa.bool_():
        base = st.booleans()
    elif pa.types.is_integer(t):
        base = st.integers(-(2 ** (t.bit_width - 1)), 2 ** (t.bit_width - 1) - 1)
    elif pa.types.is_floating(t):
        base = st.floats(allow_nan=False, width=t.bit_width)
    elif pa.types.is_decimal(t):
        base = st.decimals(min_value=-99999999, max_value=99999999, places=2,
                           allow_nan=False, allow_infinity=False)
    elif pa.types.is_string(t):
        base = st.text(max_size=6)
    elif pa.types.is_binary(t):
        base = st.binary(max_size=6)
    elif t == pa.date32():
        base = st.dates()
    else:
        base = st.datetimes(timezones=st.just(dt.UTC))
    return st.none() | base


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(strategy_for(pa.struct(list(SIZED))).filter(lambda r: r is not None),
                     max_size=12),
       cut=st.integers(0, 3))
def test_value_sizes_match_a_per_row_reference(rows, cut):
    struct_type = pa.struct(list(SIZED))
    values = pa.array(rows, struct_type)
    expected = [reference_size(row, struct_type) for row in rows]
    sizes = value_sizes(values)
    assert sizes.dtype == np.int64
    assert sizes.tolist() == expected
    # sliced arrays and null rows in the middle of nested data
    assert value_sizes(values.slice(cut)).tolist() == expected[cut:]


def test_value_sizes_ignore_values_behind_nulls():
    """A null struct or list row counts 0 even when its children hold data."""
    child = pa.array([5, 6, 7], pa.int64())
    nested = pa.StructArray.from_arrays([child], names=["x"], mask=pa.array([False, True, False]))
    listed = pa.ListArray.from_arrays(pa.array([0, 1, 2, 3], pa.int32()),
                                      pa.array(["a", "bb", "ccc"]),
                                      mask=pa.array([False, True, False]))
    values = pa.StructArray.from_arrays([nested, listed], names=["s", "l"])
    assert value_sizes(values).tolist() == [8 + 1, 0, 8 + 3]
    assert value_sizes(pa.chunked_array([values.slice(0, 1), values.slice(1)])).tolist() == [
        9, 0, 11]
    assert value_sizes(values.slice(0, 0)).tolist() == []


def test_value_struct_json_reads_a_message_larger_than_the_json_block():
    big = "x" * (3 << 20)  # 3 MiB: over pyarrow's default 1 MiB JSON block
    values = pa.array([json.dumps({"blob": big}).encode(), b'{"blob": "small"}'], pa.binary())

    result = value_struct(values, parse_schema("blob STRING"))

    assert result.field("blob").to_pylist() == [big, "small"]


# ---------------------------------------------------------------- writable_problems


def test_writable_problems_empty_for_convertible_columns():
    from npstream.proto.value_schema import writable_problems

    target = parse_schema("sensorId STRING NOT NULL, reading DOUBLE, ts TIMESTAMP, "
                          "tags ARRAY<INT>, attrs MAP<STRING, BIGINT>")
    source = pa.schema([("sensorId", pa.string()), ("reading", pa.float32()),
                        ("ts", pa.timestamp("us", tz="Europe/Paris")),
                        ("tags", pa.list_(pa.int64())),
                        ("attrs", pa.map_(pa.string(), pa.int32()))])
    assert writable_problems(source, target) == []
    assert writable_problems(pa.schema([("sensorId", pa.string())]), target) == []


def test_writable_problems_names_every_field_and_rule():
    from npstream.proto.value_schema import writable_problems

    target = parse_schema("sensorId STRING NOT NULL, reading DOUBLE, "
                          "pos STRUCT<x: DOUBLE NOT NULL>, tags ARRAY<INT>")
    source = pa.schema([("reading", pa.string()), ("color", pa.string()),
                        ("pos", pa.struct([("y", pa.float64())])),
                        ("tags", pa.list_(pa.string()))])
    assert writable_problems(source, target) == [
        ("reading", "is STRING, expected DOUBLE"),
        ("color", "is not in the stream's value schema"),
        ("pos.y", "is not in the stream's value schema"),
        ("pos.x", "is missing (NOT NULL DOUBLE)"),
        ("tags.element", "is STRING, expected INT"),
        ("sensorId", "is missing (NOT NULL STRING)"),
    ]

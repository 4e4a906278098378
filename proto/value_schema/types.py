"""The types typed streams carry, one table for every spelling, and the helpers all parts share.

Each supported type has a DDL keyword (aliases included), an Arrow type and a
Spark JSON name (docs/typed-streams.md): parse.py reads DDL and Spark JSON
through these tables, render.py writes them back, normalize.py maps any
pyarrow type onto them and evolution.py widens along the integer and float
widths. Field paths in errors ("loc.lat", "tags.element", "attrs.key") are
built by ``_join``; decimal bounds and sibling names are checked the same way
whether a schema comes from text or from pyarrow.
"""

from __future__ import annotations

import re

import pyarrow as pa

from npstream.proto.value_schema.errors import SchemaError

TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
MAX_DECIMAL_PRECISION = 38
# Names written without back quotes; anything else is back-quoted by to_ddl.
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# DDL keyword -> Arrow type for the primitive types (aliases included).
_DDL_PRIMITIVES: dict[str, pa.DataType] = {
    "BOOLEAN": pa.bool_(),
    "BOOL": pa.bool_(),
    "TINYINT": pa.int8(),
    "BYTE": pa.int8(),
    "SMALLINT": pa.int16(),
    "SHORT": pa.int16(),
    "INT": pa.int32(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "LONG": pa.int64(),
    "FLOAT": pa.float32(),
    "REAL": pa.float32(),
    "DOUBLE": pa.float64(),
    "STRING": pa.string(),
    "BINARY": pa.binary(),
    "DATE": pa.date32(),
    "TIMESTAMP": TIMESTAMP_TYPE,
    "TIMESTAMP_LTZ": TIMESTAMP_TYPE,
}
_DECIMAL_KEYWORDS = ("DECIMAL", "DEC", "NUMERIC")
# Spark types npstream knows but does not carry: named as unsupported rather than unknown.
_UNSUPPORTED_SPARK = ("TIMESTAMP_NTZ", "INTERVAL", "VOID", "VARIANT", "CHAR", "VARCHAR", "OBJECT")

# Arrow type -> (canonical DDL, Spark JSON name) for the primitive types.
_PRIMITIVE_NAMES: dict[pa.DataType, tuple[str, str]] = {
    pa.bool_(): ("BOOLEAN", "boolean"),
    pa.int8(): ("TINYINT", "byte"),
    pa.int16(): ("SMALLINT", "short"),
    pa.int32(): ("INT", "integer"),
    pa.int64(): ("BIGINT", "long"),
    pa.float32(): ("FLOAT", "float"),
    pa.float64(): ("DOUBLE", "double"),
    pa.string(): ("STRING", "string"),
    pa.binary(): ("BINARY", "binary"),
    pa.date32(): ("DATE", "date"),
    TIMESTAMP_TYPE: ("TIMESTAMP", "timestamp"),
}
_SPARK_JSON_PRIMITIVES: dict[str, pa.DataType] = {
    spark: arrow for arrow, (_, spark) in _PRIMITIVE_NAMES.items()
}
_SPARK_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(-?\d+)\s*\)\Z")

_INT_WIDTH = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64}
_FLOAT_WIDTH = {pa.float32(): 32, pa.float64(): 64}


def _join(path: str, name: str) -> str:
    """The path of a child field: "a.b"; a top-level field is its name."""
    return f"{path}.{name}" if path else name


def _is_nested(t: pa.DataType) -> bool:
    return pa.types.is_struct(t) or pa.types.is_list(t) or pa.types.is_map(t)


def _list_of(item: pa.DataType, nullable: bool) -> pa.DataType:
    return pa.list_(pa.field("item", item, nullable=nullable))


def _map_of(key: pa.DataType, value: pa.DataType, nullable: bool) -> pa.DataType:
    return pa.map_(key, pa.field("value", value, nullable=nullable))


def _check_decimal(precision: int, scale: int, path: str, position: int | None) -> pa.DataType:
    """decimal128(p, s) when Spark's DecimalType allows it (1 <= p <= 38, 0 <= s <= p)."""
    if not 1 <= precision <= MAX_DECIMAL_PRECISION or not 0 <= scale <= precision:
        at = f" at position {position}" if position is not None else ""
        raise SchemaError(
            f"DECIMAL({precision},{scale}){at} (field '{path}'): precision must be 1..38 "
            "and scale 0..precision",
            field=path,
            position=position,
        )
    return pa.decimal128(precision, scale)


def _check_names(names: list[tuple[str, int | None]], path: str) -> None:
    """Refuse empty and repeated names among siblings.

    Names compare case-insensitively, as Spark resolves columns: two fields
    differing only in case would be ambiguous once flattened into columns.
    """
    seen: dict[str, str] = {}
    for name, position in names:
        full = _join(path, name)
        at = f" at position {position}" if position is not None else ""
        if not name:
            raise SchemaError(f"empty field name{at} (in '{path or '<schema>'}')",
                              field=full, position=position)
        folded = name.casefold()
        if folded in seen:
            raise SchemaError(
                f"duplicate field name '{full}'{at}"
                + (f" (same as '{_join(path, seen[folded])}')" if seen[folded] != name else ""),
                field=full,
                position=position,
            )
        seen[folded] = name

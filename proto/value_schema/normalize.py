"""The canonical form of a user's pyarrow schema: the one form every side compares.

pyarrow spells one value type many ways (large_string, view types, timestamp
units and zones, list item names, metadata); normalizing gives the schema
parse_schema gives for its DDL, so versions compare with ``equals``, and
refuses the types typed streams do not carry, naming the field.
"""

from __future__ import annotations

import pyarrow as pa

from npstream.proto.value_schema.errors import SchemaError
from npstream.proto.value_schema.types import (
    _PRIMITIVE_NAMES,
    TIMESTAMP_TYPE,
    _check_decimal,
    _check_names,
    _is_nested,
    _join,
    _list_of,
    _map_of,
)


def _normalize_type(t: pa.DataType, path: str) -> pa.DataType:
    """The canonical form of an Arrow type, or SchemaError when typed streams cannot carry it."""
    if t in _PRIMITIVE_NAMES:
        return t
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return TIMESTAMP_TYPE
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_decimal(t):
        return _check_decimal(t.precision, t.scale, path, None)
    if (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    ):
        item = t.value_field
        return _list_of(_normalize_type(item.type, _join(path, "element")), item.nullable)
    if pa.types.is_map(t):
        key = _normalize_type(t.key_type, _join(path, "key"))
        if _is_nested(key):
            raise SchemaError(f"MAP key (field '{path}.key') must be a primitive type",
                              field=_join(path, "key"))
        item = t.item_field
        return _map_of(key, _normalize_type(item.type, _join(path, "value")), item.nullable)
    if pa.types.is_struct(t):
        if t.num_fields == 0:
            raise SchemaError(f"STRUCT with no fields (field '{path}')", field=path)
        return pa.struct(_normalize_fields([t.field(i) for i in range(t.num_fields)], path))
    raise SchemaError(f"unsupported type {t} (field '{path}')", field=path)


def _normalize_fields(fields: list[pa.Field], path: str) -> list[pa.Field]:
    _check_names([(f.name, None) for f in fields], path)
    return [
        pa.field(f.name, _normalize_type(f.type, _join(path, f.name)), nullable=f.nullable)
        for f in fields
    ]


def normalize_schema(schema: pa.Schema) -> pa.Schema:
    """The canonical form of a user's pyarrow schema (the one parse_schema gives for its DDL).

    large_string/large_binary/large_list (and the view types) become their
    plain forms, timestamps of any unit or zone ``timestamp[us, tz=UTC]``,
    decimals decimal128, list items "item"; metadata is dropped. Raises
    SchemaError naming the field for a type typed streams do not carry.
    """
    if len(schema) == 0:
        raise SchemaError("schema is empty")
    return pa.schema(_normalize_fields(list(schema), ""))

"""Writing a schema out: canonical DDL, Spark's StructType JSON and the Arrow IPC message.

Every writer normalizes first, so what goes out (to the registry, the wire,
Spark or a CLI) is always the canonical schema; ``deserialize_schema`` is the
IPC message's way back in. ``_type_ddl`` is also how every error message of
the package names an expected type.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from npstream.proto.value_schema.errors import SchemaError
from npstream.proto.value_schema.normalize import normalize_schema
from npstream.proto.value_schema.types import _PLAIN_NAME, _PRIMITIVE_NAMES


def _quote(name: str) -> str:
    return name if _PLAIN_NAME.match(name) else "`" + name.replace("`", "``") + "`"


def _type_ddl(t: pa.DataType) -> str:
    """Canonical DDL of one (canonical) type; used in messages as the expected type too."""
    if t in _PRIMITIVE_NAMES:
        return _PRIMITIVE_NAMES[t][0]
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_list(t):
        item = t.value_field
        return f"ARRAY<{_type_ddl(item.type)}{'' if item.nullable else ' NOT NULL'}>"
    if pa.types.is_map(t):
        item = t.item_field
        return (f"MAP<{_type_ddl(t.key_type)}, {_type_ddl(item.type)}"
                f"{'' if item.nullable else ' NOT NULL'}>")
    if pa.types.is_struct(t):
        return "STRUCT<" + ", ".join(
            _field_ddl(t.field(i), ": ") for i in range(t.num_fields)) + ">"
    return str(t)  # only reached for types normalize_schema refuses


def _field_ddl(f: pa.Field, separator: str) -> str:
    return f"{_quote(f.name)}{separator}{_type_ddl(f.type)}{'' if f.nullable else ' NOT NULL'}"


def to_ddl(schema: pa.Schema) -> str:
    """Canonical DDL: "sensorId STRING, reading DOUBLE NOT NULL, loc STRUCT<lat: DOUBLE>".

    parse_schema(to_ddl(s)) equals s for every canonical s. Spark's
    StructType.fromDDL reads it too, except for NOT NULL on array elements
    and map values (use to_spark_json for Spark).
    """
    return ", ".join(_field_ddl(f, " ") for f in normalize_schema(schema))


def _spark_type_json(t: pa.DataType) -> Any:
    if t in _PRIMITIVE_NAMES:
        return _PRIMITIVE_NAMES[t][1]
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_list(t):
        return {"type": "array", "elementType": _spark_type_json(t.value_type),
                "containsNull": t.value_field.nullable}
    if pa.types.is_map(t):
        return {"type": "map", "keyType": _spark_type_json(t.key_type),
                "valueType": _spark_type_json(t.item_type),
                "valueContainsNull": t.item_field.nullable}
    return _spark_struct_json([t.field(i) for i in range(t.num_fields)])


def _spark_struct_json(fields: list[pa.Field]) -> dict[str, Any]:
    return {"type": "struct", "fields": [
        {"name": f.name, "type": _spark_type_json(f.type), "nullable": f.nullable, "metadata": {}}
        for f in fields
    ]}


def to_spark_json(schema: pa.Schema) -> str:
    """Spark's StructType JSON, byte for byte what ``StructType.json()`` writes for it.

    parse_schema(to_spark_json(s)) equals s; the Spark side builds its
    StructType with ``StructType.fromJson(json.loads(...))``.
    """
    value = _spark_struct_json(list(normalize_schema(schema)))
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def serialize_schema(schema: pa.Schema) -> bytes:
    """The value schema as an Arrow IPC schema message (ValueSchema.arrow_schema)."""
    return bytes(normalize_schema(schema).serialize().to_pybytes())


def deserialize_schema(data: bytes) -> pa.Schema:
    """The value schema from an Arrow IPC schema message, checked and canonical."""
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise SchemaError(f"not an Arrow IPC schema message: {exc}") from exc
    return normalize_schema(schema)

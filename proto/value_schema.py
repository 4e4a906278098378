"""Typed streams' value schemas (docs/typed-streams.md), defined once for the broker and the client.

A typed stream's value is a record of an Arrow schema restricted to the types
Spark has (the table in docs/typed-streams.md), so the same schema can be
written as Spark DDL, as Spark's StructType JSON or as a pyarrow schema, and
always comes out as the same canonical Arrow schema: the broker compares
versions with ``equals``, the Spark connector maps it to a StructType and the
client checks values before sending, all from this one module.

The module also holds the column-wise operations both sides need on values:
turning published values (a struct column, or JSON objects one per message)
into the schema's struct (``value_struct``), bringing a batch stored under an
older version to the latest one (``conform_batch``), the evolution rules
(``check_evolution``) and per-message sizes for ``max_message_bytes``
(``value_sizes``). None of them loops over rows in Python on the success path;
only locating the first bad message of a refused request does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from npstream.proto.schema import MESSAGE_SCHEMA

__all__ = [
    "IncompatibleSchemaError",
    "SchemaError",
    "ValueMismatchError",
    "check_evolution",
    "conform_batch",
    "deserialize_schema",
    "normalize_schema",
    "parse_schema",
    "serialize_schema",
    "stored_schema",
    "to_ddl",
    "to_spark_json",
    "value_sizes",
    "value_struct",
]


# ---------------------------------------------------------------- errors


class SchemaError(ValueError):
    """The schema text or object is invalid or unsupported.

    ``field`` is the path of the field to blame ("loc.lat"; list elements are
    "tags.element", map keys/values "attrs.key"/"attrs.value"), ``position``
    the 0-based character position in the DDL/JSON text when parsing failed,
    so a CLI or an error detail can point at the spot.
    """

    def __init__(self, message: str, *, field: str | None = None, position: int | None = None):
        super().__init__(message)
        self.field = field
        self.position = position


class IncompatibleSchemaError(SchemaError):
    """A schema change the evolution rules refuse; the message names the field path and the rule."""

    def __init__(self, message: str, *, field: str, rule: str):
        super().__init__(message, field=field)
        self.rule = rule


class ValueMismatchError(ValueError):
    """A published value does not fit the schema; nothing of the request may be stored.

    ``index`` is the message's 0-based index in the request, ``field`` the
    field path ("" when the value as a whole is wrong, e.g. not a JSON
    object), ``expected`` the expected type as DDL.
    """

    def __init__(self, index: int, field: str, expected: str, problem: str):
        where = f"field '{field}'" if field else "the value"
        super().__init__(f"message {index}: {where} {problem}; expected {expected}")
        self.index = index
        self.field = field
        self.expected = expected
        self.problem = problem


# ---------------------------------------------------------------- types

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


# ---------------------------------------------------------------- DDL parsing


@dataclass(frozen=True)
class _Token:
    kind: str  # "word", "name" (back-quoted), "number", "string", "punct", "end"
    text: str
    position: int


_PUNCT = "<>(),:"


def _tokenize(text: str) -> list[_Token]:
    """Split DDL into tokens with their 0-based positions (errors name the position)."""
    tokens: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c.isalpha() or c == "_":
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] == "_") and text[j].isascii():
                j += 1
            if not c.isascii():
                raise SchemaError(f"unexpected character {c!r} at position {i}", position=i)
            tokens.append(_Token("word", text[i:j], i))
            i = j
        elif c.isdigit():
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            tokens.append(_Token("number", text[i:j], i))
            i = j
        elif c == "`":
            parts: list[str] = []
            j = i + 1
            while True:
                end = text.find("`", j)
                if end < 0:
                    raise SchemaError(f"unterminated back-quoted name at position {i}", position=i)
                parts.append(text[j:end])
                if text.startswith("``", end):  # `` inside back quotes is one back quote
                    parts.append("`")
                    j = end + 2
                    continue
                break
            tokens.append(_Token("name", "".join(parts), i))
            i = end + 1
        elif c in "'\"":
            end = text.find(c, i + 1)
            if end < 0:
                raise SchemaError(f"unterminated string at position {i}", position=i)
            tokens.append(_Token("string", text[i + 1 : end], i))
            i = end + 1
        elif c in _PUNCT:
            tokens.append(_Token("punct", c, i))
            i += 1
        else:
            raise SchemaError(f"unexpected character {c!r} at position {i}", position=i)
    tokens.append(_Token("end", "", n))
    return tokens


class _DdlParser:
    """Recursive descent over Spark's DDL grammar for the supported types.

    fields  := field ("," field)*          (or STRUCT<fields> as a whole)
    field   := name [":"] type [NOT NULL] [COMMENT 'text']
    type    := primitive | DECIMAL[(p[, s])] | ARRAY<type [NOT NULL]>
             | MAP<type, type [NOT NULL]> | STRUCT<fields>
    ``NOT NULL`` on array elements and map values is npstream's extension
    (Spark's DDL cannot say it; its JSON can), so every schema has a DDL.
    """

    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def take(self) -> _Token:
        token = self.peek()
        self.i += 1
        return token

    def is_word(self, word: str, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind == "word" and token.text.upper() == word

    def is_punct(self, char: str) -> bool:
        token = self.peek()
        return token.kind == "punct" and token.text == char

    def fail(self, expected: str, path: str | None = None) -> SchemaError:
        token = self.peek()
        found = "the end of the schema" if token.kind == "end" else repr(token.text)
        where = f" (field '{path}')" if path else ""
        return SchemaError(
            f"expected {expected} at position {token.position}, found {found}{where}",
            field=path or None,
            position=token.position,
        )

    def expect(self, char: str, path: str | None) -> None:
        if not self.is_punct(char):
            raise self.fail(f"'{char}'", path)
        self.take()

    def parse(self) -> pa.Schema:
        if self.peek().kind == "end":
            raise SchemaError("schema is empty", position=0)
        if self.is_word("STRUCT") and self.peek(1).kind == "punct" and self.peek(1).text == "<":
            self.i += 2  # "struct<a:int,b:string>" as Spark's simpleString writes it
            fields = self.fields("", closing=">")
            self.expect(">", None)
        else:
            fields = self.fields("", closing=None)
        if self.peek().kind != "end":
            raise self.fail("',' or the end of the schema")
        return pa.schema(fields)

    def fields(self, path: str, closing: str | None) -> list[pa.Field]:
        fields: list[pa.Field] = []
        names: list[tuple[str, int | None]] = []
        while True:
            token = self.peek()
            if token.kind not in ("word", "name"):
                if not fields and closing and self.is_punct(closing):
                    raise SchemaError(
                        f"STRUCT with no fields at position {token.position} (field '{path}')",
                        field=path,
                        position=token.position,
                    )
                raise self.fail("a field name", path or None)
            self.take()
            name = token.text
            full = _join(path, name)
            names.append((name, token.position))
            _check_names(names, path)
            if self.is_punct(":"):
                self.take()
            data_type = self.data_type(full)
            nullable = not self.not_null(full)
            if self.is_word("COMMENT"):
                self.take()
                if self.peek().kind != "string":
                    raise self.fail("a quoted comment", full)
                self.take()
            fields.append(pa.field(name, data_type, nullable=nullable))
            if not self.is_punct(","):
                return fields
            self.take()

    def not_null(self, path: str) -> bool:
        if self.is_word("NOT"):
            if not self.is_word("NULL", 1):
                self.take()
                raise self.fail("NULL after NOT", path)
            self.i += 2
            return True
        return False

    def data_type(self, path: str) -> pa.DataType:
        token = self.peek()
        if token.kind != "word":
            raise self.fail("a type", path)
        self.take()
        word = token.text.upper()
        if word in _DDL_PRIMITIVES:
            return _DDL_PRIMITIVES[word]
        if word in _DECIMAL_KEYWORDS:
            precision, scale = 10, 0  # Spark's default DECIMAL
            if self.is_punct("("):
                self.take()
                precision = self.number(path)
                if self.is_punct(","):
                    self.take()
                    scale = self.number(path)
                self.expect(")", path)
            return _check_decimal(precision, scale, path, token.position)
        if word == "ARRAY":
            self.expect("<", path)
            element = self.data_type(_join(path, "element"))
            nullable = not self.not_null(_join(path, "element"))
            self.expect(">", path)
            return _list_of(element, nullable)
        if word == "MAP":
            self.expect("<", path)
            key_token = self.peek()
            key = self.data_type(_join(path, "key"))
            if _is_nested(key):
                raise SchemaError(
                    f"MAP key at position {key_token.position} (field '{path}.key') must be a "
                    "primitive type",
                    field=_join(path, "key"),
                    position=key_token.position,
                )
            self.expect(",", path)
            value = self.data_type(_join(path, "value"))
            nullable = not self.not_null(_join(path, "value"))
            self.expect(">", path)
            return _map_of(key, value, nullable)
        if word == "STRUCT":
            self.expect("<", path)
            fields = self.fields(path, closing=">")
            self.expect(">", path)
            return pa.struct(fields)
        kind = "unsupported" if word in _UNSUPPORTED_SPARK else "unknown"
        raise SchemaError(
            f"{kind} type '{token.text}' at position {token.position} (field '{path}')",
            field=path,
            position=token.position,
        )

    def number(self, path: str) -> int:
        if self.peek().kind != "number":
            raise self.fail("a number", path)
        return int(self.take().text)


# ---------------------------------------------------------------- Spark JSON parsing


def _spark_json_type(value: Any, path: str) -> pa.DataType:
    """Arrow type of one Spark JSON type (a name like "long" or a dict for nested types)."""
    if isinstance(value, str):
        name = value.strip().lower()
        if name in _SPARK_JSON_PRIMITIVES:
            return _SPARK_JSON_PRIMITIVES[name]
        if name == "decimal":
            return _check_decimal(10, 0, path, None)
        match = _SPARK_DECIMAL.match(name)
        if match:
            return _check_decimal(int(match.group(1)), int(match.group(2)), path, None)
        kind = "unsupported" if name.upper().split("(")[0] in _UNSUPPORTED_SPARK else "unknown"
        raise SchemaError(f"{kind} type '{value}' (field '{path}')", field=path)
    if isinstance(value, dict):
        nested = value.get("type")
        if nested == "struct":
            return pa.struct(_spark_json_fields(value, path))
        if nested == "array":
            element = _spark_json_type(value.get("elementType"), _join(path, "element"))
            return _list_of(element, _json_bool(value, "containsNull", path, default=True))
        if nested == "map":
            key = _spark_json_type(value.get("keyType"), _join(path, "key"))
            if _is_nested(key):
                raise SchemaError(
                    f"MAP key (field '{path}.key') must be a primitive type",
                    field=_join(path, "key"),
                )
            item = _spark_json_type(value.get("valueType"), _join(path, "value"))
            return _map_of(key, item, _json_bool(value, "valueContainsNull", path, default=True))
        if nested == "udt" and "sqlType" in value:  # a user-defined type is stored as its sqlType
            return _spark_json_type(value["sqlType"], path)
        raise SchemaError(f"unknown type {json.dumps(value)[:80]} (field '{path}')", field=path)
    raise SchemaError(f"expected a type, found {json.dumps(value)[:80]} (field '{path}')",
                      field=path)


def _json_bool(value: dict[str, Any], key: str, path: str, default: bool) -> bool:
    flag = value.get(key, default)
    if not isinstance(flag, bool):
        raise SchemaError(f"'{key}' must be true or false (field '{path}')", field=path or None)
    return flag


def _spark_json_fields(value: dict[str, Any], path: str) -> list[pa.Field]:
    raw = value.get("fields")
    if not isinstance(raw, list):
        raise SchemaError(f"a struct needs a 'fields' list (field '{path or '<schema>'}')",
                          field=path or None)
    if not raw:
        if not path:
            raise SchemaError("schema is empty")
        raise SchemaError(f"STRUCT with no fields (field '{path}')", field=path)
    fields: list[pa.Field] = []
    names: list[tuple[str, int | None]] = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise SchemaError(f"a field needs a 'name' (in '{path or '<schema>'}')",
                              field=path or None)
        name = item["name"]
        names.append((name, None))
        _check_names(names, path)
        full = _join(path, name)
        if "type" not in item:
            raise SchemaError(f"field '{full}' has no 'type'", field=full)
        data_type = _spark_json_type(item["type"], full)
        fields.append(pa.field(name, data_type,
                               nullable=_json_bool(item, "nullable", full, default=True)))
    return fields


def _parse_spark_json(text: str) -> pa.Schema:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"invalid JSON at position {exc.pos}: {exc.msg}",
                          position=exc.pos) from exc
    if not isinstance(value, dict) or value.get("type") != "struct":
        raise SchemaError('a JSON schema must be a Spark StructType: {"type": "struct", '
                          '"fields": [...]}')
    return pa.schema(_spark_json_fields(value, ""))


def parse_schema(text: str) -> pa.Schema:
    """The canonical Arrow schema of a DDL or Spark StructType JSON text.

    JSON when the text starts with "{" (after white space), DDL otherwise.
    Raises SchemaError naming the position and/or the field.
    """
    if text.lstrip().startswith("{"):
        return _parse_spark_json(text)
    return _DdlParser(text).parse()


# ---------------------------------------------------------------- normalizing


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


# ---------------------------------------------------------------- writing


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


def stored_schema(value_schema: pa.Schema) -> pa.Schema:
    """The stored/fetched batch schema of a typed stream: MESSAGE_SCHEMA with ``value`` a struct."""
    value = pa.field("value", pa.struct(list(value_schema)), nullable=False)
    return MESSAGE_SCHEMA.set(MESSAGE_SCHEMA.get_field_index("value"), value)


# ---------------------------------------------------------------- evolution

_RULE_REMOVED = "fields cannot be removed or renamed"
_RULE_ADDED = "added fields must be nullable"
_RULE_NOT_NULL = "NOT NULL can be dropped, never added"
_RULE_WIDEN = (
    "a type can only be widened: TINYINT -> SMALLINT -> INT -> BIGINT, FLOAT -> DOUBLE, "
    "DECIMAL(p,s) -> DECIMAL(p2,s) with p2 > p"
)


def _incompatible(path: str, what: str, rule: str) -> IncompatibleSchemaError:
    return IncompatibleSchemaError(f"field '{path}' {what} (rule: {rule})", field=path, rule=rule)


def _is_widening(old: pa.DataType, new: pa.DataType) -> bool:
    if old in _INT_WIDTH and new in _INT_WIDTH:
        return _INT_WIDTH[old] < _INT_WIDTH[new]
    if old in _FLOAT_WIDTH and new in _FLOAT_WIDTH:
        return _FLOAT_WIDTH[old] < _FLOAT_WIDTH[new]
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return bool(old.scale == new.scale and new.precision > old.precision)
    return False


def _check_nullability(old: bool, new: bool, path: str) -> None:
    if old and not new:
        raise _incompatible(path, "became NOT NULL", _RULE_NOT_NULL)


def _check_type(old: pa.DataType, new: pa.DataType, path: str) -> None:
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        _check_fields([old.field(i) for i in range(old.num_fields)],
                      [new.field(i) for i in range(new.num_fields)], path)
    elif pa.types.is_list(old) and pa.types.is_list(new):
        element = _join(path, "element")
        _check_nullability(old.value_field.nullable, new.value_field.nullable, element)
        _check_type(old.value_type, new.value_type, element)
    elif pa.types.is_map(old) and pa.types.is_map(new):
        if old.key_type != new.key_type:
            raise _incompatible(
                _join(path, "key"),
                f"changed from {_type_ddl(old.key_type)} to {_type_ddl(new.key_type)}",
                "MAP keys cannot change")
        value = _join(path, "value")
        _check_nullability(old.item_field.nullable, new.item_field.nullable, value)
        _check_type(old.item_type, new.item_type, value)
    elif old != new and not _is_widening(old, new):
        raise _incompatible(path, f"changed from {_type_ddl(old)} to {_type_ddl(new)}",
                            _RULE_WIDEN)


def _check_fields(old: list[pa.Field], new: list[pa.Field], path: str) -> None:
    new_by_name = {f.name: f for f in new}
    old_names = {f.name for f in old}
    for field in old:
        full = _join(path, field.name)
        if field.name not in new_by_name:
            raise _incompatible(full, "was removed", _RULE_REMOVED)
        replacement = new_by_name[field.name]
        _check_nullability(field.nullable, replacement.nullable, full)
        _check_type(field.type, replacement.type, full)
    for field in new:
        if field.name not in old_names and not field.nullable:
            raise _incompatible(_join(path, field.name), "was added as NOT NULL", _RULE_ADDED)


def check_evolution(old: pa.Schema, new: pa.Schema) -> None:
    """Raise IncompatibleSchemaError unless ``new`` may follow ``old`` as the next version.

    Fields match by name at every level (order does not matter); see
    docs/typed-streams.md for the rules. Both schemas are canonical.
    """
    _check_fields(list(old), list(new), "")


# ---------------------------------------------------------------- converting values


class _Mismatch(Exception):
    """A value that does not fit, at a row of the array being converted (internal).

    Rows are translated to the enclosing array's rows while the error travels
    up through lists and maps, so the top level sees the message index.
    """

    def __init__(self, row: int, field: str, expected: str, problem: str):
        super().__init__(row, field, expected, problem)
        self.row = row
        self.field = field
        self.expected = expected
        self.problem = problem


def _first_true(mask: pa.Array | np.ndarray) -> int:
    return int(np.argmax(np.asarray(mask, dtype=bool)))


def _valid_mask(arr: pa.Array) -> np.ndarray:
    """Per-row validity as numpy booleans (all True when there are no nulls)."""
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return np.asarray(arr.is_valid(), dtype=bool)


def _first_null_row(child: pa.Array, parent_valid: np.ndarray | None) -> int | None:
    """First row where ``child`` is null while its parent is valid, or None."""
    if child.null_count == 0:
        return None
    bad = ~np.asarray(child.is_valid(), dtype=bool)
    if parent_valid is not None:
        bad &= parent_valid
    return _first_true(bad) if bad.any() else None


def _first_failing_row(arr: pa.Array, convert: Callable[[pa.Array], Any]) -> tuple[int, str]:
    """Bisect for the first row ``convert`` fails on (error path only) and that failure's text."""
    lo, hi = 0, len(arr)
    message = ""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            convert(arr.slice(lo, mid - lo))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            hi, message = mid, str(exc)
        else:
            lo = mid
    if not message:
        try:
            convert(arr.slice(lo, 1))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            message = str(exc)
    return lo, message


def _castable(source: pa.DataType, target: pa.DataType, json_mode: bool) -> bool:
    """Whether a value of ``source`` may become ``target`` (with a safe cast checking each value).

    Numbers convert among numbers (overflow and lost digits are caught by the
    safe cast), text to text/bytes, timestamps among units; nothing converts
    between kinds (a string is never parsed into a number), except dates
    from JSON text.
    """
    if pa.types.is_null(source):
        return True
    numeric = pa.types.is_integer(source) or pa.types.is_floating(source)
    if target in _INT_WIDTH or target in _FLOAT_WIDTH:
        return bool(numeric)
    if pa.types.is_decimal(target):
        return bool(numeric or pa.types.is_decimal(source))
    text = (pa.types.is_string(source) or pa.types.is_large_string(source)
            or pa.types.is_string_view(source))
    if target == pa.string():
        return bool(text)
    if target == pa.binary():
        return bool(text or pa.types.is_binary(source) or pa.types.is_large_binary(source)
                    or pa.types.is_binary_view(source) or pa.types.is_fixed_size_binary(source))
    if target == pa.date32():
        return bool(pa.types.is_date(source) or (json_mode and text))
    if target == TIMESTAMP_TYPE:
        return bool(pa.types.is_timestamp(source))
    return False


def _describe(t: pa.DataType) -> str:
    try:
        return _type_ddl(_normalize_type(t, ""))
    except SchemaError:
        return str(t)


def _has_required(t: pa.DataType) -> bool:
    """Whether a NOT NULL appears inside ``t`` (then equal types still need a null check)."""
    if pa.types.is_struct(t):
        return any(not f.nullable or _has_required(f.type)
                   for f in (t.field(i) for i in range(t.num_fields)))
    if pa.types.is_list(t):
        return not t.value_field.nullable or _has_required(t.value_type)
    if pa.types.is_map(t):
        return not t.item_field.nullable or _has_required(t.item_type)
    return False


def _list_parts(arr: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(offsets starting at 0, the child values they index) of a list or map array.

    Values under null slots are dropped, so nothing hidden behind a null is
    converted or checked.
    """
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = arr.values.slice(offsets[0], offsets[-1] - offsets[0])
    offsets = offsets - offsets[0]
    if arr.null_count:
        lengths = np.diff(offsets)
        valid = _valid_mask(arr)
        if lengths[~valid].any():
            keep = np.repeat(valid, lengths)
            values = values.filter(pa.array(keep))
            lengths = np.where(valid, lengths, 0)
            offsets = np.concatenate(([0], np.cumsum(lengths)))
    return offsets, values


def _row_of(offsets: np.ndarray, element: int) -> int:
    return int(np.searchsorted(offsets, element, side="right") - 1)


def _null_mask(arr: pa.Array) -> pa.Array | None:
    return arr.is_null() if arr.null_count else None


@dataclass(frozen=True)
class _Mode:
    """How values convert: publishing refuses extra fields, reading old batches drops them."""

    json: bool  # JSON-parsed input: dates arrive as strings, maps as lists of key/value structs
    extra_fields: bool  # whether fields not in the target are refused (publish) or dropped


_PUBLISH = _Mode(json=False, extra_fields=True)
_PUBLISH_JSON = _Mode(json=True, extra_fields=True)
_STORED = _Mode(json=False, extra_fields=False)


def _conform_struct(arr: pa.Array, target: pa.DataType, path: str, mode: _Mode) -> pa.Array:
    if not pa.types.is_struct(arr.type):
        raise _Mismatch(0, path, _type_ddl(target), f"is {_describe(arr.type)}")
    source = arr.type
    source_names = [source.field(i).name for i in range(source.num_fields)]
    target_names = {target.field(i).name for i in range(target.num_fields)}
    parent_valid = _valid_mask(arr) if arr.null_count else None
    first_valid = 0 if parent_valid is None else (_first_true(parent_valid) if len(arr) else 0)
    errors: list[_Mismatch] = []
    if mode.extra_fields and len(arr) and (parent_valid is None or parent_valid.any()):
        for name in source_names:
            if name not in target_names:
                errors.append(_Mismatch(first_valid, _join(path, name), _type_ddl(target),
                                        "is not in the schema"))
    children: list[pa.Array] = []
    for i in range(target.num_fields):
        field = target.field(i)
        full = _join(path, field.name)
        if source_names.count(field.name) > 1:
            errors.append(_Mismatch(0, full, _type_ddl(field.type), "appears twice"))
            continue
        if field.name not in source_names:
            if not field.nullable and len(arr) and (parent_valid is None or parent_valid.any()):
                errors.append(_Mismatch(first_valid, full, _type_ddl(field.type),
                                        "is missing (NOT NULL)"))
                continue
            children.append(pa.nulls(len(arr), field.type))
            continue
        child = arr.field(source_names.index(field.name))
        try:
            child = _conform(child, field.type, full, mode)
        except _Mismatch as exc:
            errors.append(exc)
            continue
        if not field.nullable:
            row = _first_null_row(child, parent_valid)
            if row is not None:
                errors.append(_Mismatch(row, full, _type_ddl(field.type), "is null (NOT NULL)"))
                continue
        children.append(child)
    if errors:
        raise min(errors, key=lambda e: e.row)
    fields = [target.field(i) for i in range(target.num_fields)]
    return pa.StructArray.from_arrays(children, fields=fields, mask=_null_mask(arr))


def _conform_list(arr: pa.Array, target: pa.DataType, path: str, mode: _Mode) -> pa.Array:
    is_list = (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)
               or pa.types.is_fixed_size_list(arr.type))
    if not is_list:
        raise _Mismatch(0, path, _type_ddl(target), f"is {_describe(arr.type)}")
    if pa.types.is_fixed_size_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_field))
    offsets, values = _list_parts(arr)
    element_path = _join(path, "element")
    field = target.value_field
    try:
        values = _conform(values, field.type, element_path, mode)
        if not field.nullable:
            row = _first_null_row(values, None)
            if row is not None:
                raise _Mismatch(row, element_path, _type_ddl(field.type), "is null (NOT NULL)")
    except _Mismatch as exc:
        raise _Mismatch(_row_of(offsets, exc.row), exc.field, exc.expected, exc.problem) from None
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, type=target,
                                    mask=_null_mask(arr))


def _conform_map(arr: pa.Array, target: pa.DataType, path: str, mode: _Mode) -> pa.Array:
    if pa.types.is_map(arr.type):
        offsets, entries = _list_parts(arr)
    elif (mode.json and pa.types.is_list(arr.type) and pa.types.is_struct(arr.type.value_type)):
        offsets, entries = _list_parts(arr)  # JSON objects were read as [{key, value}] lists
    else:
        raise _Mismatch(0, path, _type_ddl(target), f"is {_describe(arr.type)}")
    keys, items = entries.field(0), entries.field(1)
    item_field = target.item_field
    errors: list[_Mismatch] = []
    try:
        keys = _conform(keys, target.key_type, _join(path, "key"), mode)
        row = _first_null_row(keys, None)
        if row is not None:
            errors.append(_Mismatch(row, _join(path, "key"), _type_ddl(target.key_type),
                                    "is null"))
    except _Mismatch as exc:
        errors.append(exc)
    try:
        items = _conform(items, item_field.type, _join(path, "value"), mode)
        if not item_field.nullable:
            row = _first_null_row(items, None)
            if row is not None:
                errors.append(_Mismatch(row, _join(path, "value"), _type_ddl(item_field.type),
                                        "is null (NOT NULL)"))
    except _Mismatch as exc:
        errors.append(exc)
    if errors:
        first = min(errors, key=lambda e: e.row)
        raise _Mismatch(_row_of(offsets, first.row), first.field, first.expected, first.problem)
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys, items, type=target,
                                   mask=_null_mask(arr))


def _conform(arr: pa.Array, target: pa.DataType, path: str, mode: _Mode) -> pa.Array:
    """``arr`` as exactly ``target``: children matched by name, casts safe, NOT NULL checked.

    Raises _Mismatch at the first offending row of ``arr``.
    """
    if arr.type == target and not _has_required(target):
        return arr
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), target)
    if pa.types.is_struct(target):
        return _conform_struct(arr, target, path, mode)
    if pa.types.is_list(target):
        return _conform_list(arr, target, path, mode)
    if pa.types.is_map(target):
        return _conform_map(arr, target, path, mode)
    if not _castable(arr.type, target, mode.json):
        valid = _valid_mask(arr)
        row = _first_true(valid) if valid.any() else 0
        raise _Mismatch(row, path, _type_ddl(target), f"is {_describe(arr.type)}")
    try:
        return arr.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        row, message = _first_failing_row(arr, lambda part: part.cast(target, safe=True))
        raise _Mismatch(row, path, _type_ddl(target), f"cannot be converted: {message}") from None


def _single_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        if values.num_chunks == 1:
            return values.chunk(0)
        if values.num_chunks == 0:
            return pa.array([], values.type)
        return values.combine_chunks()
    return values


def _value_type(value_schema: pa.Schema) -> pa.DataType:
    return pa.struct(list(value_schema))


def _raise_value_mismatch(exc: _Mismatch, index_base: int = 0) -> ValueMismatchError:
    return ValueMismatchError(index_base + exc.row, exc.field, exc.expected, exc.problem)


def _conform_top(arr: pa.Array, target: pa.DataType, mode: _Mode, json_input: bool) -> pa.Array:
    """The top-level value struct: no nulls allowed at the struct level."""
    if arr.null_count:
        row = _first_true(arr.is_null())
        problem = "is not a JSON object" if json_input else "is null"
        raise _Mismatch(row, "", _type_ddl(target), problem)
    return _conform(arr, target, "", mode)


# ---------------------------------------------------------------- JSON input


def _json_parse_type(t: pa.DataType) -> pa.DataType:
    """The type pyarrow's JSON reader reads a value of ``t`` as.

    Everything nullable (the reader refuses a NOT NULL child of a null struct,
    so NOT NULL is checked afterwards with the message index), dates as text
    (the reader takes only numbers for date32), maps as lists of key/value
    structs (the reader has no maps; the messages are rewritten to match),
    decimals at the widest precision (the safe cast afterwards checks it).
    """
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _json_parse_type(f.type))
                          for f in (t.field(i) for i in range(t.num_fields))])
    if pa.types.is_list(t):
        return pa.list_(_json_parse_type(t.value_type))
    if pa.types.is_map(t):
        return pa.list_(pa.struct([pa.field("key", _json_parse_type(t.key_type)),
                                   pa.field("value", _json_parse_type(t.item_type))]))
    if t == pa.date32():
        return pa.string()
    if pa.types.is_decimal(t):
        # The reader checks the precision of the text, not of the rescaled value
        # (123456789.5 passes as DECIMAL(10,2)); read wide, let the safe cast check.
        return pa.decimal128(MAX_DECIMAL_PRECISION, t.scale)
    return t


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return any(_has_map(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t):
        return _has_map(t.value_type)
    return bool(pa.types.is_map(t))


def _json_key(key: str, t: pa.DataType) -> Any:
    """A JSON object's key (always text) as the JSON value the key type is read from."""
    try:
        if pa.types.is_integer(t):
            return int(key)
        if pa.types.is_floating(t):
            return float(key)
    except ValueError:
        return key  # left as text: the reader refuses it and the diagnosis names it
    if pa.types.is_boolean(t):
        return {"true": True, "false": False}.get(key, key)
    return key


def _rewrite_maps(value: Any, t: pa.DataType) -> Any:
    """A parsed JSON value with its maps (objects) as [{"key", "value"}] lists, for the reader."""
    if pa.types.is_struct(t) and isinstance(value, dict):
        out = dict(value)
        for i in range(t.num_fields):
            field = t.field(i)
            if field.name in out and _has_map(field.type):
                out[field.name] = _rewrite_maps(out[field.name], field.type)
        return out
    if pa.types.is_list(t) and isinstance(value, list):
        return [_rewrite_maps(item, t.value_type) for item in value]
    if pa.types.is_map(t) and isinstance(value, dict):
        return [{"key": _json_key(k, t.key_type), "value": _rewrite_maps(v, t.item_type)}
                for k, v in value.items()]
    return value


def _rewrite_messages(values: pa.Array, target: pa.DataType) -> pa.Array:
    """Per-message rewrite for schemas with maps (the one JSON path with a Python row loop)."""
    out: list[bytes | None] = []
    for raw in values.to_pylist():
        if raw is None:
            out.append(None)
            continue
        try:
            parsed = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            out.append(raw)  # stays invalid; the reader refuses it at this index
            continue
        out.append(json.dumps(_rewrite_maps(parsed, target), separators=(",", ":")).encode())
    return pa.array(out, pa.binary())


_WRAP_OPEN = b'{"v":'
_WRAP_CLOSE = b"}\n"


# pyarrow's JSON reader needs every line inside one block (default 1 MiB); a
# message up to the gRPC limit must read, so blocks grow to the longest line.
_MIN_JSON_BLOCK_BYTES = 1 << 20


def _json_read_options(longest_line: int) -> pa_json.ReadOptions:
    return pa_json.ReadOptions(block_size=max(_MIN_JSON_BLOCK_BYTES, longest_line + 1))


class _JsonReader:
    """Column-wise reading of JSON objects, one per message, with exact message indices.

    Each message is read as the line ``{"v":<message>}``: every boundary
    between messages is then a ``}`` followed by ``{``, which JSON only allows
    between two top-level values, so no message can merge with its neighbour
    and each yields at least one row; the row count equal to the message
    count then proves one row per message. Unexpected fields are errors.
    """

    def __init__(self, values: pa.Array, target: pa.DataType):
        self.count = len(values)
        self.target = target
        self.values = values
        lines = pc.binary_join_element_wise(_WRAP_OPEN, values, _WRAP_CLOSE, b"")
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)
        self.offsets = offsets[lines.offset : lines.offset + len(lines) + 1]
        self.data = lines.buffers()[2]
        self.schema = pa.schema([pa.field("v", _json_parse_type(target))])
        self.read_options = _json_read_options(
            int(np.diff(self.offsets).max()) if self.count else 0)

    def read(self, lo: int, hi: int, newlines_in_values: bool) -> pa.Array | None:
        """The parsed struct of messages [lo, hi), or None when they do not read."""
        start, end = int(self.offsets[lo]), int(self.offsets[hi])
        options = pa_json.ParseOptions(explicit_schema=self.schema,
                                       unexpected_field_behavior="error",
                                       newlines_in_values=newlines_in_values)
        try:
            table = pa_json.read_json(pa.BufferReader(self.data.slice(start, end - start)),
                                      read_options=self.read_options, parse_options=options)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if table.num_rows != hi - lo:
            return None
        return _single_array(table.column(0))

    def first_unreadable(self, newlines_in_values: bool) -> int:
        """Bisect for the first message that does not read (error path only)."""
        lo, hi = 0, self.count
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.read(lo, mid, newlines_in_values) is None:
                hi = mid
            else:
                lo = mid
        return lo


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fits_json(value: Any, t: pa.DataType) -> bool:
    """Whether pyarrow reads the JSON ``value`` as a primitive ``t`` (the diagnosis' oracle)."""
    line = json.dumps({"v": value}).encode()
    options = pa_json.ParseOptions(explicit_schema=pa.schema([("v", _json_parse_type(t))]))
    try:
        column = pa_json.read_json(pa.BufferReader(line),
                                   read_options=_json_read_options(len(line)),
                                   parse_options=options).column(0)
        if column.type != t:
            column.cast(t, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def _diagnose(value: Any, t: pa.DataType, path: str) -> tuple[str, str, str] | None:
    """(field, expected, problem) of the first thing in one parsed message that does not fit."""
    expected = _type_ddl(t)
    if pa.types.is_struct(t):
        if not isinstance(value, dict):
            return path, expected, ("is not a JSON object" if not path else f"is {_show(value)}")
        names = {t.field(i).name for i in range(t.num_fields)}
        for key in value:
            if key not in names:
                return _join(path, key), expected, "is not in the schema"
        for i in range(t.num_fields):
            field = t.field(i)
            full = _join(path, field.name)
            if value.get(field.name) is None:
                if not field.nullable:
                    return full, _type_ddl(field.type), "is missing or null (NOT NULL)"
                continue
            found = _diagnose(value[field.name], field.type, full)
            if found:
                return found
        return None
    if pa.types.is_list(t):
        if not isinstance(value, list):
            return path, expected, f"is {_show(value)}"
        element = _join(path, "element")
        for item in value:
            if item is None:
                if not t.value_field.nullable:
                    return element, _type_ddl(t.value_type), "is null (NOT NULL)"
                continue
            found = _diagnose(item, t.value_type, element)
            if found:
                return found
        return None
    if pa.types.is_map(t):
        if not isinstance(value, dict):
            return path, expected, f"is {_show(value)}"
        for key, item in value.items():
            if not _fits_json(_json_key(key, t.key_type), t.key_type):
                return _join(path, "key"), _type_ddl(t.key_type), f"is {_show(key)}"
            if item is None:
                if not t.item_field.nullable:
                    return _join(path, "value"), _type_ddl(t.item_type), "is null (NOT NULL)"
                continue
            found = _diagnose(item, t.item_type, _join(path, "value"))
            if found:
                return found
        return None
    if not _fits_json(value, t):
        return path, expected, f"is {_show(value)}"
    return None


def _json_mismatch(raw: bytes | None, target: pa.DataType, index: int) -> ValueMismatchError:
    """The ValueMismatchError for one message the reader refused."""
    expected = _type_ddl(target)
    if raw is None:
        return ValueMismatchError(index, "", expected, "is not a JSON object (null)")
    try:
        parsed = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        detail = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        return ValueMismatchError(index, "", expected, f"is not valid JSON ({detail})")
    found = _diagnose(parsed, target, "")
    if found is None:
        return ValueMismatchError(index, "", expected,
                                  f"cannot be read: {_show(parsed)} does not read as the schema")
    return ValueMismatchError(index, *found)


def _value_struct_json(values: pa.Array, target: pa.DataType) -> pa.Array:
    if not pa.types.is_binary(values.type):
        values = values.cast(pa.binary())
    if values.null_count:
        index = _first_true(values.is_null())
        raise ValueMismatchError(index, "", _type_ddl(target), "is not a JSON object (null)")
    originals = values
    if _has_map(target):
        values = _rewrite_messages(values, target)
    reader = _JsonReader(values, target)
    parsed = reader.read(0, reader.count, newlines_in_values=False)
    newlines = False
    if parsed is None and pc.any(pc.match_substring(values, "\n")).as_py():
        # A message with a line break: reading line by line cut it; read values across lines.
        newlines = True
        parsed = reader.read(0, reader.count, newlines_in_values=True)
    if parsed is not None:
        try:
            return _conform_top(parsed, target, _PUBLISH_JSON, json_input=True)
        except _Mismatch as exc:
            raise _raise_value_mismatch(exc) from None
    bad = reader.first_unreadable(newlines)
    # An earlier message may read but break a NOT NULL or a date: that one comes first.
    if bad:
        before = reader.read(0, bad, newlines)
        if before is not None:
            try:
                _conform_top(before, target, _PUBLISH_JSON, json_input=True)
            except _Mismatch as exc:
                raise _raise_value_mismatch(exc) from None
    raise _json_mismatch(originals[bad].as_py(), target, bad)


def value_struct(values: pa.Array | pa.ChunkedArray, value_schema: pa.Schema) -> pa.StructArray:
    """Published values as exactly ``pa.struct(value_schema)``, or ValueMismatchError.

    ``values`` is a struct column (fields matched by name, safely cast) or
    JSON objects in binary/string, one per message, read column-wise. The
    error names the first message that does not fit, the field and the
    expected type.
    """
    target = _value_type(value_schema)
    arr = _single_array(values)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pa.types.is_struct(arr.type):
        try:
            return _conform_top(arr, target, _PUBLISH, json_input=False)
        except _Mismatch as exc:
            raise _raise_value_mismatch(exc) from None
    if (pa.types.is_binary(arr.type) or pa.types.is_string(arr.type)
            or pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
            or pa.types.is_binary_view(arr.type) or pa.types.is_string_view(arr.type)):
        if len(arr) == 0:
            return pa.array([], target)
        return _value_struct_json(arr, target)
    if len(arr) == 0:
        return pa.array([], target)
    raise ValueMismatchError(0, "", _type_ddl(target),
                             f"is {arr.type}, not a struct or JSON objects")


def conform_batch(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """A stored batch of an older schema version in the latest version's stored schema ``target``.

    The value struct's children match by name: fields the batch lacks come
    out as nulls, widened ones are cast; the envelope columns are untouched.
    Returns ``batch`` itself when it already has the target schema.
    """
    if batch.schema.equals(target):
        return batch
    index = target.get_field_index("value")
    value_type = target.field(index).type
    try:
        value = _conform(batch.column(batch.schema.get_field_index("value")), value_type, "",
                         _STORED)
    except _Mismatch as exc:
        raise ValueError(
            f"stored batch cannot be read as the latest schema: field '{exc.field}' "
            f"{exc.problem}; expected {exc.expected}") from None
    columns = [value if name == "value" else batch.column(batch.schema.get_field_index(name))
               for name in target.names]
    return pa.RecordBatch.from_arrays(columns, schema=target)


# ---------------------------------------------------------------- sizes


def _fixed_width(t: pa.DataType) -> int | None:
    if pa.types.is_boolean(t):
        return 1
    if pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t):
        return int(t.byte_width)
    try:
        return int(t.bit_width) // 8
    except ValueError:
        return None


def _per_row_sums(offsets: np.ndarray, element_sizes: np.ndarray) -> np.ndarray:
    """Sum of element sizes per list row (offsets start at 0), via a cumulative sum."""
    cumulative = np.concatenate(([0], np.cumsum(element_sizes, dtype=np.int64)))
    return cumulative[offsets[1:]] - cumulative[offsets[:-1]]


def _sizes(arr: pa.Array) -> np.ndarray:
    """Byte size of each row of ``arr`` (0 for nulls)."""
    length = len(arr)
    if arr.null_count == length:
        return np.zeros(length, dtype=np.int64)
    t = arr.type
    if pa.types.is_struct(t):
        sizes = np.zeros(length, dtype=np.int64)
        for i in range(t.num_fields):
            sizes += _sizes(arr.field(i))
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        offsets, values = _list_parts(arr)
        if pa.types.is_map(t):
            element = _sizes(values.field(0)) + _sizes(values.field(1))
        else:
            element = _sizes(values)
        sizes = _per_row_sums(offsets, element)
    elif (pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t)
          or pa.types.is_large_string(t)):
        sizes = np.asarray(pc.fill_null(pc.binary_length(arr), 0), dtype=np.int64)
    else:
        width = _fixed_width(t)
        if width is None:
            raise ValueError(f"no size rule for type {t}")
        sizes = np.full(length, width, dtype=np.int64)
    if arr.null_count:
        sizes = np.where(_valid_mask(arr), sizes, 0)
    return sizes


def value_sizes(values: pa.StructArray) -> np.ndarray:
    """Per-message byte size of struct values, what max_message_bytes bounds in a typed stream.

    Fixed-width fields count their byte width (BOOLEAN 1), strings and binary
    their bytes, arrays and maps their elements, structs their fields; nulls
    count 0. int64, one per message.
    """
    return _sizes(_single_array(values))


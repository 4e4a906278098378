"""Reading a schema text, Spark DDL or Spark's StructType JSON, into the canonical Arrow schema.

Parsing is where a user's mistakes are found, so every SchemaError raised
here names the character position and/or the field path; writing the
canonical forms back is render.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from npstream.proto.value_schema.errors import SchemaError
from npstream.proto.value_schema.types import (
    _DDL_PRIMITIVES,
    _DECIMAL_KEYWORDS,
    _SPARK_DECIMAL,
    _SPARK_JSON_PRIMITIVES,
    _UNSUPPORTED_SPARK,
    _check_decimal,
    _check_names,
    _is_nested,
    _join,
    _list_of,
    _map_of,
)

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

"""Published values as exactly the schema's struct (``value_struct``), or the first misfit named.

Values come as a struct column (converted by conform.py) or as JSON objects,
one per message, read column-wise by pyarrow's JSON reader; the JSON path is
most of this module: each message is wrapped so it reads as exactly one row,
maps are rewritten into the key/value lists the reader understands, and a
refused request is diagnosed down to the first message, the field and the
expected type.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from npstream.proto.value_schema.conform import (
    _PUBLISH,
    _PUBLISH_JSON,
    _conform_top,
    _first_true,
    _Mismatch,
    _raise_value_mismatch,
    _single_array,
    _value_type,
)
from npstream.proto.value_schema.errors import ValueMismatchError
from npstream.proto.value_schema.render import _type_ddl
from npstream.proto.value_schema.types import MAX_DECIMAL_PRECISION, _join


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

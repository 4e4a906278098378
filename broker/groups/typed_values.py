"""Typed streams' values as groups deliver them: each record as JSON bytes.

Group deliveries (shared groups' Receive/Subscribe, cursor groups' Pull)
carry the message envelope with a binary ``value``, whatever the stream, so a
consumer of a typed stream gets each record as one compact JSON object
(docs/typed-streams.md, "Groups"). Deliveries are per message already, so the
conversion is per message too, in Python:

- a struct is an object of its fields (in schema order), a list an array, a
  map an object (keys as text);
- a timestamp is ISO-8601 UTC with a ``Z`` (``2025-01-01T12:00:00.5Z``: the
  fraction only as long as needed), a date ``YYYY-MM-DD``;
- a decimal is a JSON number with its exact digits; a non-finite float is the
  string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``;
- binary is its UTF-8 text, as value_schema.value_struct reads a JSON string
  into a BINARY field (so a delivered record published again is the same
  record); bytes that are not UTF-8 are standard base64 text;
- a null field is ``null``.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa

from npstream.proto.schema import MESSAGE_SCHEMA

__all__ = ["json_values", "untyped_batch"]

_Encoder = Callable[[Any], str]
_dumps = functools.partial(json.dumps, ensure_ascii=False)


def _scalar(value: Any) -> str:
    return _dumps(value)


def _float(value: float) -> str:
    if math.isfinite(value):
        return repr(float(value))
    return '"NaN"' if math.isnan(value) else ('"Infinity"' if value > 0 else '"-Infinity"')


def _timestamp(value: dt.datetime) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    text = value.isoformat(timespec="microseconds")
    whole, _, fraction = text.partition(".")
    fraction = fraction.rstrip("0")
    return f'"{whole}.{fraction}Z"' if fraction else f'"{whole}Z"'


def _date(value: dt.date) -> str:
    return f'"{value.isoformat()}"'


def _decimal(value: Decimal) -> str:
    return format(value, "f")


def _binary(value: bytes) -> str:
    try:
        return _dumps(value.decode("utf-8"))
    except UnicodeDecodeError:
        return f'"{base64.b64encode(value).decode("ascii")}"'


def _nullable(encode: _Encoder) -> _Encoder:
    return lambda value: "null" if value is None else encode(value)


@functools.lru_cache(maxsize=256)
def _encoder(dtype: pa.DataType) -> _Encoder:
    """The JSON text of a Python value (``to_pylist``'s form) of Arrow type ``dtype``."""
    if pa.types.is_struct(dtype):
        fields = [(_dumps(dtype.field(i).name), _encoder(dtype.field(i).type))
                  for i in range(dtype.num_fields)]
        names = [dtype.field(i).name for i in range(dtype.num_fields)]

        def struct(value: dict[str, Any]) -> str:
            return "{" + ",".join(f"{key}:{encode(value[name])}"
                                  for (key, encode), name in zip(fields, names, strict=True)) + "}"
        return _nullable(struct)
    if pa.types.is_map(dtype):
        key, item = _encoder(dtype.key_type), _encoder(dtype.item_type)

        def key_text(value: Any) -> str:  # JSON object keys are strings
            text = key(value)
            return text if text.startswith('"') else _dumps(text)

        def mapping(value: list[tuple[Any, Any]]) -> str:
            return "{" + ",".join(f"{key_text(k)}:{item(v)}" for k, v in value) + "}"
        return _nullable(mapping)
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        element = _encoder(dtype.value_type)
        return _nullable(lambda value: "[" + ",".join(map(element, value)) + "]")
    if pa.types.is_floating(dtype):
        return _nullable(_float)
    if pa.types.is_timestamp(dtype):
        return _nullable(_timestamp)
    if pa.types.is_date(dtype):
        return _nullable(_date)
    if pa.types.is_decimal(dtype):
        return _nullable(_decimal)
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return _nullable(_binary)
    return _nullable(_scalar)  # bool, integers, strings


def json_values(values: pa.Array) -> list[bytes]:
    """Each record of a typed stream's ``value`` struct column as compact JSON bytes."""
    encode = _encoder(values.type)
    return [encode(value).encode() for value in values.to_pylist()]


def untyped_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A typed stream's stored batch in MESSAGE_SCHEMA, with each value as JSON bytes."""
    index = batch.schema.get_field_index("value")
    values = pa.array(json_values(batch.column(index)), pa.binary())
    columns = [values if i == index else batch.column(i) for i in range(batch.num_columns)]
    return pa.RecordBatch.from_arrays(columns, schema=MESSAGE_SCHEMA)

"""Converting an Arrow value column to exactly a schema's struct, column-wise.

One conversion serves publishing (values.value_struct: fields not in the
schema refused) and reading (``conform_batch``: a batch stored under an older
version brought to the latest one, such fields dropped); ``stored_schema`` is
the batch schema a typed stream stores and fetches. Children match by name,
casts are safe and NOT NULL is checked; a value that does not fit is reported
at the row of the first one. No Python loop over rows on the success path;
only locating the first bad row of a refused column bisects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.proto.value_schema.errors import SchemaError, ValueMismatchError
from npstream.proto.value_schema.normalize import _normalize_type
from npstream.proto.value_schema.render import _type_ddl
from npstream.proto.value_schema.types import (
    _FLOAT_WIDTH,
    _INT_WIDTH,
    TIMESTAMP_TYPE,
    _join,
)


def stored_schema(value_schema: pa.Schema) -> pa.Schema:
    """The stored/fetched batch schema of a typed stream: MESSAGE_SCHEMA with ``value`` a struct."""
    value = pa.field("value", pa.struct(list(value_schema)), nullable=False)
    return MESSAGE_SCHEMA.set(MESSAGE_SCHEMA.get_field_index("value"), value)


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


def writable_problems(source: pa.Schema, target: pa.Schema) -> list[tuple[str, str]]:
    """(field path, problem) for each field of ``source`` that can never be written as ``target``.

    A writer that knows its columns' types before it has any rows (Spark, at
    query start) checks them here by type alone, with the rules the values
    are converted by later (``value_struct``): fields match by name, a field
    ``target`` lacks is refused, a missing NOT NULL field is refused, types
    must be convertible (a safe cast then checks each value). Nullability of
    ``source`` is not held against it: nulls in a NOT NULL field are caught
    when the values come. Empty when every field can be written.
    """
    problems: list[tuple[str, str]] = []
    _writable(pa.struct(list(source)), pa.struct(list(target)), "", problems)
    return problems


def _writable(source: pa.DataType, target: pa.DataType, path: str,
              problems: list[tuple[str, str]]) -> None:
    expected = _type_ddl(target)
    if pa.types.is_null(source) or source == target:
        return
    if pa.types.is_struct(target):
        if not pa.types.is_struct(source):
            problems.append((path, f"is {_describe(source)}, expected {expected}"))
            return
        names = {target.field(i).name: target.field(i) for i in range(target.num_fields)}
        have = {source.field(i).name: source.field(i) for i in range(source.num_fields)}
        for name, field in have.items():
            if name not in names:
                problems.append((_join(path, name), "is not in the stream's value schema"))
            else:
                _writable(field.type, names[name].type, _join(path, name), problems)
        for name, field in names.items():
            if name not in have and not field.nullable:
                problems.append((_join(path, name),
                                 f"is missing (NOT NULL {_type_ddl(field.type)})"))
        return
    if pa.types.is_list(target):
        if not (pa.types.is_list(source) or pa.types.is_large_list(source)
                or pa.types.is_fixed_size_list(source)):
            problems.append((path, f"is {_describe(source)}, expected {expected}"))
            return
        _writable(source.value_type, target.value_type, _join(path, "element"), problems)
        return
    if pa.types.is_map(target):
        if not pa.types.is_map(source):
            problems.append((path, f"is {_describe(source)}, expected {expected}"))
            return
        _writable(source.key_type, target.key_type, _join(path, "key"), problems)
        _writable(source.item_type, target.item_type, _join(path, "value"), problems)
        return
    if not _castable(source, target, json_mode=False):
        problems.append((path, f"is {_describe(source)}, expected {expected}"))

"""Per-message byte sizes of typed values (``value_sizes``): what max_message_bytes bounds.

The rule is part of the contract (proto/message_size.py counts a typed
record's value with it): the broker checks appends against it and the client
sizes its publish batches with it, so both must count alike.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from npstream.proto.value_schema.conform import _list_parts, _single_array, _valid_mask


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

"""What a stream's ``max_message_bytes`` bounds, defined once for every path and both sides.

A message's size is the bytes of its value, its key and its header names
(UTF-8) and values; the id is not counted. A typed stream's value is a
record, whose bytes are ``npstream.proto.value_schema.value_sizes`` (passed
to ``message_sizes`` as ``value_sizes``). A limit of 0 means no limit, and
a message of exactly the limit is accepted. Publish, Stage and commit each
compute sizes in the form their data has (Arrow columns or Python values),
and all of them compare through ``first_oversized``, so the rule cannot drift
between paths; a client that wants to check before sending calls the same
functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["first_oversized", "message_size", "message_sizes"]


def _single_chunk(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array (no copy when it already is one chunk)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _headers_sizes(headers: pa.MapArray) -> np.ndarray:
    """Per-row sum of header name and value lengths (0 for null rows), without a row loop."""
    length = len(headers)
    if headers.null_count == length:
        return np.zeros(length, dtype=np.int64)
    # keys/items are the unsliced children and offsets index into them, so
    # sliced map arrays come out right without copying.
    entry_sizes = np.asarray(
        pc.add(
            pc.fill_null(pc.binary_length(headers.keys), 0),
            pc.fill_null(pc.binary_length(headers.items), 0),
        ),
        dtype=np.int64,
    )
    cumulative = np.concatenate(([0], np.cumsum(entry_sizes)))
    offsets = np.asarray(headers.offsets, dtype=np.int64)
    sizes = cumulative[offsets[1:]] - cumulative[offsets[:-1]]
    if headers.null_count:
        sizes = np.where(np.asarray(headers.is_valid()), sizes, 0)
    return sizes


def message_sizes(table: pa.Table, value_sizes: np.ndarray | None = None) -> np.ndarray:
    """Size of every row of a publish-typed table (``value`` and optional ``key``, ``headers``).

    int64, one per row; columns the table lacks count 0. ``value_sizes``
    replaces the value's byte lengths (a typed stream's struct value).
    """
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    names = table.schema.names
    if value_sizes is not None:
        sizes = np.asarray(value_sizes, dtype=np.int64)
    else:
        value = _single_chunk(table.column("value"))
        lengths = pc.binary_length(value)
        sizes = np.asarray(pc.fill_null(lengths, 0) if value.null_count else lengths,
                           dtype=np.int64)
    if "key" in names:
        key = _single_chunk(table.column("key"))
        if key.null_count != len(key):
            sizes = sizes + np.asarray(pc.fill_null(pc.binary_length(key), 0), dtype=np.int64)
    if "headers" in names:
        headers = _single_chunk(table.column("headers"))
        if headers.null_count != len(headers):
            sizes = sizes + _headers_sizes(headers)
    return sizes


def message_size(value: bytes, key: bytes | None, headers: Mapping[str, bytes] | None) -> int:
    """The size of one message given as Python values (same rule as ``message_sizes``)."""
    size = len(value) + (len(key) if key is not None else 0)
    if headers:
        size += sum(len(name.encode()) + len(item) for name, item in headers.items())
    return size


def first_oversized(sizes: Sequence[int] | np.ndarray, limit: int) -> int | None:
    """Index of the first size over ``limit``; None when none is, or ``limit`` is 0 (no limit)."""
    if limit <= 0 or len(sizes) == 0:
        return None
    largest = sizes.max() if isinstance(sizes, np.ndarray) else max(sizes)  # one pass, in C
    if largest <= limit:
        return None
    return int(np.argmax(np.asarray(sizes) > limit))

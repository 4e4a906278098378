"""Splitting a publish table into wire-sized requests, and offsets back per input row.

Both directions are columnar (pyarrow.compute and numpy over whole columns):
``publish_batch`` of 100,000 rows costs a handful of vector operations, not
100,000 Python iterations.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from npstream.errors import NpstreamError
from npstream.proto import pb
from npstream.proto.value_schema import value_sizes
from npstream.proto.wire import encode_with_bytes

__all__ = [
    "REQUEST_TARGET_BYTES",
    "chunk_offsets",
    "encode_ipc_stream",
    "encode_publish_request",
    "row_sizes",
    "split_rows",
]

# ---------------------------------------------------------------- tuning
# Aim for publish requests of about this many payload bytes: big enough to
# amortize a round trip and an fsync, small enough to stay far below the 64 MiB
# gRPC limit and to keep the broker's group-commit batches moving.
REQUEST_TARGET_BYTES = 4 * 1024 * 1024
# Per-row bookkeeping on the wire (Arrow offsets, validity bits), added to the
# payload bytes so that many tiny rows still split.
ROW_OVERHEAD_BYTES = 16


def _lengths(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False).astype(
        np.int64
    )


def _header_bytes(column: pa.ChunkedArray) -> np.ndarray:
    parts: list[np.ndarray] = []
    for chunk in column.chunks:
        # keys/items are the unsliced entry arrays; offsets index into them.
        entry = _lengths(chunk.keys) + _lengths(chunk.items)
        cumulative = np.concatenate(([0], np.cumsum(entry)))
        offsets = chunk.offsets.to_numpy(zero_copy_only=False)
        parts.append(cumulative[offsets[1:]] - cumulative[offsets[:-1]])
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _value_bytes(column: pa.ChunkedArray) -> np.ndarray:
    """Bytes of each value: binary lengths, or a typed stream's record sizes (a struct)."""
    if not pa.types.is_struct(column.type):
        return _lengths(column)
    parts = [np.asarray(value_sizes(chunk), dtype=np.int64) for chunk in column.chunks]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def row_sizes(table: pa.Table) -> np.ndarray:
    """Approximate wire bytes of each row of a normalized publish table."""
    sizes = _value_bytes(table.column("value")) + ROW_OVERHEAD_BYTES
    for name in ("id", "key"):
        if name in table.column_names:
            sizes += _lengths(table.column(name))
    if "headers" in table.column_names:
        sizes += _header_bytes(table.column("headers"))
    return sizes


def split_rows(
    sizes: np.ndarray, target_bytes: int = REQUEST_TARGET_BYTES
) -> list[tuple[int, int]]:
    """Consecutive ``(start, stop)`` row ranges of about ``target_bytes`` each.

    Every range holds at least one row, so a single row larger than the
    target travels alone.
    """
    total = len(sizes)
    cumulative = np.cumsum(sizes)
    ranges: list[tuple[int, int]] = []
    start = 0
    while start < total:
        before = int(cumulative[start - 1]) if start else 0
        stop = int(np.searchsorted(cumulative, before + target_bytes, side="right"))
        stop = max(stop, start + 1)
        ranges.append((start, stop))
        start = stop
    return ranges


def encode_ipc_stream(table: pa.Table) -> bytes:
    """The table as one Arrow IPC stream (schema + record batches), as PublishRequest wants."""
    return _ipc_stream_buffer(table).to_pybytes()


def _ipc_stream_buffer(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def encode_publish_request(stream: str, ack: pb.Ack, table: pa.Table) -> bytes:
    """Wire bytes of ``PublishRequest(stream, arrow_stream=<table as IPC>, ack)``.

    The IPC bytes are copied once instead of three times (to bytes, into the
    message, out of it again; npstream.proto.wire): on ~4 MiB requests those copies
    were most of the client's CPU. A test checks it parses to the same message.
    """
    head = pb.PublishRequest(stream=stream, ack=ack)
    ipc = _ipc_stream_buffer(table)
    return encode_with_bytes(head, "arrow_stream", [ipc] if ipc.size else [])


def chunk_offsets(
    count: int, first_offset: int, stored_count: int, duplicates: Iterable[tuple[int, int]]
) -> np.ndarray:
    """Offset of each of ``count`` request rows from a PublishResponse.

    Stored rows get ``first_offset, first_offset + 1, ...`` in request order;
    a duplicate gets the offset of its stored original.
    """
    offsets = np.empty(count, np.int64)
    stored = np.ones(count, dtype=bool)
    pairs = np.array(list(duplicates), dtype=np.int64).reshape(-1, 2)
    if len(pairs):
        stored[pairs[:, 0]] = False
        offsets[pairs[:, 0]] = pairs[:, 1]
    if int(stored.sum()) != stored_count:
        raise NpstreamError(
            f"broker reported {stored_count} stored and {len(pairs)} duplicate(s) "
            f"for a request of {count} message(s)"
        )
    offsets[stored] = first_offset + np.arange(stored_count, dtype=np.int64)
    return offsets


def iter_slices(table: pa.Table, ranges: list[tuple[int, int]]) -> Iterator[pa.Table]:
    for start, stop in ranges:
        yield table.slice(start, stop - start)

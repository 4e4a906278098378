"""Columnar construction of stored batches: sizes, ids, offsets, timestamps, edge slices.

Everything here works on whole Arrow arrays (pyarrow.compute / numpy); no
function loops over rows in Python, so a 10,000-row append costs about as
much as a copy of its bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from npstream.broker.errors import MessageTooLargeError
from npstream.broker.storage.tuning import CACHED_NULLS_MAX_LENGTH
from npstream.proto.message_size import first_oversized, message_sizes
from npstream.proto.schema import MESSAGE_SCHEMA, PUBLISH_COLUMNS

__all__ = [
    "PUBLISH_SCHEMA",
    "build_message_batch",
    "check_message_sizes",
    "complete_publish_table",
    "frame_slices",
    "generated_ids",
    "message_sizes",
    "null_array",
    "producer_id_mask",
    "reencode_rows",
    "serialize_frames",
    "typed_publish_schema",
]

# The publish columns in a fixed order, all present: what the writer concatenates.
PUBLISH_SCHEMA = pa.schema(
    [pa.field(name, dtype, nullable=name != "value") for name, dtype in PUBLISH_COLUMNS.items()]
)
_TIMESTAMP_TYPE = MESSAGE_SCHEMA.field("timestamp").type



def null_array(dtype: pa.DataType, length: int) -> pa.Array:
    """An all-null array whose buffers stay small when sliced and serialized.

    pyarrow.nulls() builds map children as long as the array, and a slice of
    it serializes all of them; this one has empty children. Arrays are
    immutable, so the common lengths are built once and shared.
    """
    if length <= CACHED_NULLS_MAX_LENGTH:
        return _cached_null_array(dtype, length)
    return _build_null_array(dtype, length)


def _build_null_array(dtype: pa.DataType, length: int) -> pa.Array:
    if pa.types.is_map(dtype):
        offsets = pa.array(np.zeros(length + 1, dtype=np.int32))
        mask = pa.array(np.ones(length, dtype=bool))
        return pa.MapArray.from_arrays(
            offsets, pa.array([], dtype.key_type), pa.array([], dtype.item_type), mask=mask
        )
    return pa.nulls(length, dtype)


_cached_null_array = functools.lru_cache(maxsize=128)(_build_null_array)


def _single_chunk(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array (no copy when it already is one chunk)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def typed_publish_schema(value_type: pa.StructType) -> pa.Schema:
    """PUBLISH_SCHEMA with a typed stream's ``value`` struct in place of the binary value."""
    return PUBLISH_SCHEMA.set(0, pa.field("value", value_type, nullable=False))


def complete_publish_table(table: pa.Table, schema: pa.Schema = PUBLISH_SCHEMA) -> pa.Table:
    """``table`` (normalize_publish_table output) with every column of ``schema``, one chunk.

    ``schema`` is PUBLISH_SCHEMA, or typed_publish_schema for a typed stream
    (whose ``value`` is then already the struct of that type).
    """
    length = table.num_rows
    columns: list[pa.Array] = []
    for field in schema:
        if field.name in table.column_names:
            column = _single_chunk(table.column(field.name))
            if column.null_count == length and length:
                column = null_array(field.type, length)
        else:
            column = null_array(field.type, length)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def check_message_sizes(sizes: Sequence[int] | np.ndarray, stream: str, limit: int, *,
                        staged: bool = False) -> None:
    """The broker's one max_message_bytes check: MessageTooLargeError for the first size over it.

    A path computes the sizes in the form its data has, with the rule of
    npstream.proto.message_size (Arrow columns: ``message_sizes``, Python
    values: ``message_size``), and comes here, so every path refuses the same
    messages with the same error. ``staged`` words it for a Stage (rows,
    "nothing was staged").
    """
    index = first_oversized(sizes, limit)
    if index is not None:
        raise MessageTooLargeError(stream, index, int(sizes[index]), limit, staged=staged)


def producer_id_mask(ids: pa.Array) -> pa.BooleanArray:
    """True where the publisher supplied an id (not null, not empty)."""
    return pc.fill_null(pc.greater(pc.binary_length(ids), 0), False)


# The 4 hex characters of every 16-bit value, as the little-endian uint32 of the four.
_HEX_QUADS = np.frombuffer(b"".join(b"%04x" % value for value in range(1 << 16)), dtype="<u4")
ID_PREFIX_CHARS = 16
GENERATED_ID_CHARS = ID_PREFIX_CHARS + 16


def generated_ids(id_prefix: bytes, first_offset: int, length: int) -> pa.StringArray:
    """Ids ``<16 hex chars of id_prefix><offset as 16 hex digits>`` for offsets first.. onwards.

    Built as one fixed-width character matrix (no per-row formatting): 32 hex
    characters, unique within the stream because offsets are never reused and
    across streams because the prefix is random per opened log. Every staged
    or published row without an id passes through here, so it is built the
    cheap way: the offsets are consecutive, so their upper 48 bits are one
    value for up to 65,536 rows at a time and only the last four characters
    need a table lookup per row.
    """
    if len(id_prefix) != ID_PREFIX_CHARS:
        raise ValueError(f"id prefix must be {ID_PREFIX_CHARS} characters, got {id_prefix!r}")
    # Rows of 32 characters as 8 uint32 words: 4 of prefix, 3 for the upper
    # 12 hex digits of the offset, 1 for its lowest 4.
    words = np.empty((length, 8), dtype=np.uint32)
    for column, word in enumerate(np.frombuffer(id_prefix, dtype=np.uint32)):
        words[:, column] = word  # column-wise fills: far faster than a 2-D broadcast
    low = np.arange(first_offset & 0xFFFF, (first_offset & 0xFFFF) + length, dtype=np.intp)
    np.take(_HEX_QUADS, low & 0xFFFF, out=words[:, 7])
    start = 0
    while start < length:  # one run per value of the upper 48 bits
        upper = (first_offset + start) >> 16
        end = min(length, ((upper + 1) << 16) - first_offset)
        for column, word in enumerate(np.frombuffer(b"%012x" % upper, dtype=np.uint32)):
            words[start:end, 4 + column] = word
        start = end
    value_offsets = np.arange(0, GENERATED_ID_CHARS * (length + 1), GENERATED_ID_CHARS,
                              dtype=np.int32)
    return pa.StringArray.from_buffers(length, pa.py_buffer(value_offsets),
                                       pa.py_buffer(words.view(np.uint8)))


def build_message_batch(
    table: pa.Table, first_offset: int, timestamp_ms: int, id_prefix: bytes,
    schema: pa.Schema = MESSAGE_SCHEMA,
) -> pa.RecordBatch:
    """The stored batch of ``table`` (PUBLISH_SCHEMA) at ``first_offset``, in ``schema``.

    ``schema`` is MESSAGE_SCHEMA, or for a typed stream the stored schema of
    the version ``table``'s value struct is in (typed_publish_schema). Rows
    without a producer id (null or empty) get a generated_ids() id.
    """
    length = table.num_rows
    offsets = pa.array(np.arange(first_offset, first_offset + length, dtype=np.int64))
    ids = _single_chunk(table.column("id"))
    if ids.null_count == length:
        filled = generated_ids(id_prefix, first_offset, length)
    else:
        supplied = producer_id_mask(ids)
        if pc.all(supplied).as_py():
            filled = ids
        else:
            filled = pc.if_else(supplied, ids, generated_ids(id_prefix, first_offset, length))
    timestamps = pa.Array.from_buffers(
        _TIMESTAMP_TYPE, length, [None, pa.py_buffer(np.full(length, timestamp_ms, np.int64))]
    )
    columns = [
        offsets,
        filled,
        _single_chunk(table.column("key")),
        _single_chunk(table.column("value")),
        timestamps,
        _single_chunk(table.column("headers")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def frame_slices(num_rows: int, size: int, max_frame_bytes: int) -> list[tuple[int, int]]:
    """(first row, row count) of the frames a batch is cut into: the one cutting rule.

    ``size`` is the batch's serialized IPC size. A batch that fits
    ``max_frame_bytes`` (or has one row) is one frame; a bigger one is cut
    into runs of equal row counts (the last shorter), sized by the average
    row, so each frame is about ``max_frame_bytes``. Appends
    (``serialize_frames``) and staged segments (staged_segment.py) both cut
    this way.
    """
    if size <= max_frame_bytes or num_rows <= 1:
        return [(0, num_rows)]
    step = max(1, num_rows * max_frame_bytes // size)
    return [(start, min(step, num_rows - start)) for start in range(0, num_rows, step)]


def serialize_frames(
    batch: pa.RecordBatch, max_frame_bytes: int
) -> list[tuple[int, int, pa.Buffer]]:
    """(first row, row count, IPC payload) pieces of ``batch``, about ``max_frame_bytes`` each.

    The whole batch is serialized first: it is one piece in the common case.
    """
    whole = batch.serialize()
    slices = frame_slices(batch.num_rows, whole.size, max_frame_bytes)
    if len(slices) == 1:
        return [(0, batch.num_rows, whole)]
    return [(start, count, batch.slice(start, count).serialize()) for start, count in slices]


def reencode_rows(batch: pa.RecordBatch, start: int, stop: int) -> bytes:
    """Serialize rows [start, stop) of a stored batch as a compact IPC message.

    Used only at range edges; the batch keeps its own schema (MESSAGE_SCHEMA
    or a typed stream's stored schema). Columns that are entirely null in the
    slice are rebuilt so that no unused child buffer is serialized with it.
    """
    part = batch.slice(start, stop - start)
    columns = [
        null_array(column.type, len(column))
        if pa.types.is_map(column.type) and column.null_count == len(column) and len(column)
        else column
        for column in part.columns
    ]
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema).serialize().to_pybytes()

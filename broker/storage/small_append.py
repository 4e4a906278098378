"""The lean path for publishes of a few messages given as Python values (``Client.publish``).

The general append path is built for Arrow tables of thousands of rows: it
completes, checks and stamps whole columns with pyarrow compute and numpy,
about forty pyarrow calls per append. Each call costs microseconds whatever
its length, so a one-message publish spent ~200 us of broker CPU there, most of
its publish-to-fetch latency. Rows that arrive as Python values (the
``messages`` field of a PublishRequest) are already per-row objects, so here
the checks run on those values and the columns are built directly:

- ``prepare_rows`` replaces ``prepare_append`` (same checks, same errors, same
  ``PendingAppend``), for any number of rows;
- ``build_stored_batch`` replaces ``build_message_batch`` for groups of at
  most ``SMALL_BATCH_MAX_ROWS`` rows and delegates to it above that;
- a *lone message* (one value, no id, key or headers: what ``Client.publish``
  usually sends) written alone skips both, and pyarrow altogether: its payload
  is a copy of an earlier lone payload with the same value length (a
  template), with the four parts that differ (offset, id, value, timestamp)
  overwritten at their places. Building and serializing the batch was ~30 us
  of the ~90 us a one-message append costs, on every delivery's path.

The stored batches are the same, byte for byte, as the general path's
(tests/broker/storage/test_small_append.py compares them), so readers, the
on-disk format and dedup see no difference.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa

from npstream.broker.storage.append_plan import PendingAppend
from npstream.broker.storage.batch_builder import (
    GENERATED_ID_CHARS,
    PUBLISH_SCHEMA,
    build_message_batch,
    check_message_sizes,
    null_array,
)
from npstream.broker.storage.dedup import find_intra_duplicates
from npstream.broker.storage.tuning import (
    LONE_TEMPLATE_MAX_BYTES,
    LONE_TEMPLATES,
    SMALL_BATCH_MAX_ROWS,
)
from npstream.proto.frames.payload import decode_payload
from npstream.proto.message_size import message_size
from npstream.proto.schema import MESSAGE_SCHEMA

__all__ = ["LoneMessage", "MessageRows",
           "build_stored_batch", "lone_message", "lone_payload", "prepare_rows",
           "remember_lone_template", "rows_table"]


_INT64 = pa.int64()
_STRING = pa.string()
_BINARY = pa.binary()
_TIMESTAMP = MESSAGE_SCHEMA.field("timestamp").type
_HEADERS = PUBLISH_SCHEMA.field("headers").type
_PUBLISH_INDEX = {name: index for index, name in enumerate(PUBLISH_SCHEMA.names)}


@dataclass(frozen=True, slots=True)
class MessageRows:
    """Messages as parallel lists; an empty id means "assign one", None an absent field."""

    values: Sequence[bytes]
    ids: Sequence[str]
    keys: Sequence[bytes | None]
    headers: Sequence[dict[str, bytes] | None]


def rows_table(rows: MessageRows) -> pa.Table:
    """The rows as a publish table (an empty id as null), for the general append path.

    A typed stream's appends take that path: the values (JSON bytes) become
    the struct of its schema column-wise there (append_plan.typed_values).
    """
    length = len(rows.values)
    ids = ([i or None for i in rows.ids] if any(rows.ids) else None)
    return pa.Table.from_arrays([
        pa.array(rows.values, _BINARY),
        pa.array(ids, _STRING) if ids is not None else null_array(_STRING, length),
        (pa.array(rows.keys, _BINARY) if any(k is not None for k in rows.keys)
         else null_array(_BINARY, length)),
        (pa.array([list(h.items()) if h else None for h in rows.headers], _HEADERS)
         if any(rows.headers) else null_array(_HEADERS, length)),
    ], schema=PUBLISH_SCHEMA)


def _check_sizes(rows: MessageRows, stream: str, limit: int) -> None:
    """check_message_sizes for rows that are Python values already (no Arrow needed)."""
    sizes = [message_size(value, key, headers)
             for value, key, headers in zip(rows.values, rows.keys, rows.headers, strict=True)]
    check_message_sizes(sizes, stream, limit)


def prepare_rows(
    rows: MessageRows, stream: str, max_message_bytes: int, *, find_repeats: bool
) -> PendingAppend:
    """``prepare_append`` for rows given as Python values; raises before anything is queued."""
    _check_sizes(rows, stream, max_message_bytes)
    length = len(rows.values)
    supplied: pa.BooleanArray | None = None
    if any(rows.ids):
        ids = pa.array([i or None for i in rows.ids], _STRING)
        supplied = pa.array([bool(i) for i in rows.ids], pa.bool_())
    else:
        ids = null_array(_STRING, length)
    keys = (pa.array(rows.keys, _BINARY) if any(k is not None for k in rows.keys)
            else null_array(_BINARY, length))
    headers = (pa.array([list(h.items()) if h else None for h in rows.headers], _HEADERS)
               if any(rows.headers) else null_array(_HEADERS, length))
    table = pa.Table.from_arrays([pa.array(rows.values, _BINARY), ids, keys, headers],
                                 schema=PUBLISH_SCHEMA)
    intra = None
    if supplied is not None and find_repeats:
        given = [i for i in rows.ids if i]
        if len(set(given)) < len(given):
            intra = find_intra_duplicates(ids, supplied)
    return PendingAppend(table, supplied, intra)


@dataclass(frozen=True, slots=True)
class LoneMessage:
    """A publish of one message with a value only; see lone_payload."""

    value: bytes

    def pending(self) -> PendingAppend:
        """The general form, for when it is written together with other appends."""
        return prepare_rows(MessageRows([self.value], [""], [None], [None]), "", 0,
                            find_repeats=False)


def lone_message(rows: MessageRows, stream: str, max_message_bytes: int) -> LoneMessage | None:
    """``rows`` as a LoneMessage when it is one (size checked as prepare_rows does), else None."""
    if (len(rows.values) != 1 or rows.ids[0] or rows.keys[0] is not None or rows.headers[0]
            or not isinstance(rows.values[0], bytes)):
        return None
    _check_sizes(rows, stream, max_message_bytes)
    return LoneMessage(rows.values[0])


class _Template(NamedTuple):
    payload: bytes  # a stored lone payload; the four parts below are overwritten
    offset_at: int  # byte positions of the offset, id, value and timestamp data
    id_at: int
    value_at: int
    timestamp_at: int


_COLUMNS = {name: MESSAGE_SCHEMA.get_field_index(name)
            for name in ("offset", "id", "value", "timestamp")}
_templates: dict[int, _Template] = {}  # value length -> template; read without the lock
_templates_lock = threading.Lock()  # for changes
_INT64_FIELD = struct.Struct("<q")


def remember_lone_template(payload: pa.Buffer) -> None:
    """Keep a just-built lone payload as the template for its value length.

    Positions come from the payload itself (where each column's data buffer
    starts), so a template is whatever pyarrow wrote, never a layout guessed
    here. Payloads whose layout is not the plain one (nulls, no data buffer)
    are not kept.
    """
    batch = decode_payload(payload)
    if batch.num_rows != 1:
        return
    length = len(batch.column(_COLUMNS["value"])[0].as_py())
    if length > LONE_TEMPLATE_MAX_BYTES or length in _templates:
        return
    base = payload.address
    positions = []
    for name, size in (("offset", 8), ("id", GENERATED_ID_CHARS), ("value", length),
                       ("timestamp", 8)):
        array = batch.column(_COLUMNS[name])
        data = array.buffers()[-1]
        if array.null_count or array.offset or data is None or data.size < size:
            return
        positions.append(data.address - base)
    with _templates_lock:
        while len(_templates) >= LONE_TEMPLATES:
            del _templates[next(iter(_templates))]
        _templates[length] = _Template(payload.to_pybytes(), *positions)


def lone_payload(value: bytes, offset: int, timestamp_ms: int, id_prefix: bytes) -> bytes | None:
    """The stored payload of a lone message at ``offset``, None when no template fits.

    Byte for byte what ``build_stored_batch(...).serialize()`` gives (the
    Arrow IPC layout of a one-row batch depends only on its value length; see
    tests/broker/storage/test_small_append.py).
    """
    template = _templates.get(len(value))
    if template is None:
        return None
    out = bytearray(template.payload)
    _INT64_FIELD.pack_into(out, template.offset_at, offset)
    out[template.id_at:template.id_at + GENERATED_ID_CHARS] = id_prefix + b"%016x" % offset
    out[template.value_at:template.value_at + len(value)] = value
    _INT64_FIELD.pack_into(out, template.timestamp_at, timestamp_ms)
    return bytes(out)


def _column(table: pa.Table, name: str) -> pa.Array:
    column = table.column(_PUBLISH_INDEX[name])  # by index: a name lookup costs more
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _int64_buffer(values: Sequence[int]) -> pa.Buffer:
    return pa.py_buffer(struct.pack(f"<{len(values)}q", *values))


def build_stored_batch(
    table: pa.Table, first_offset: int, timestamp_ms: int, id_prefix: bytes
) -> pa.RecordBatch:
    """``build_message_batch``'s result, built from Python values when ``table`` is small."""
    length = table.num_rows
    if length > SMALL_BATCH_MAX_ROWS:
        return build_message_batch(table, first_offset, timestamp_ms, id_prefix)
    offsets = range(first_offset, first_offset + length)
    given = _column(table, "id")
    generated = [id_prefix + b"%016x" % offset for offset in offsets]  # generated_ids' format
    if given.null_count == length:
        ids = pa.Array.from_buffers(_STRING, length, [
            None,
            pa.py_buffer(struct.pack(f"<{length + 1}i",
                                     *range(0, GENERATED_ID_CHARS * (length + 1),
                                            GENERATED_ID_CHARS))),
            pa.py_buffer(b"".join(generated)),
        ])
    else:
        ids = pa.array([supplied or made.decode()
                        for supplied, made in zip(given.to_pylist(), generated, strict=True)],
                       _STRING)
    columns = [
        pa.Array.from_buffers(_INT64, length, [None, _int64_buffer(offsets)]),
        ids,
        _column(table, "key"),
        _column(table, "value"),
        pa.Array.from_buffers(_TIMESTAMP, length, [None, _int64_buffer([timestamp_ms] * length)]),
        _column(table, "headers"),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=MESSAGE_SCHEMA)

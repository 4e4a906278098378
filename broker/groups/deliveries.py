"""What a shared group hands out: leased messages and their rows, as Python rows or one Arrow batch.

A delivery is leased messages (leases.py) with one attempt number and lease
end, and their rows, which come as stored Arrow batches (read from the log,
or the log's last write) or, for a lone message the log kept as Python
values, as a list of rows. Two shapes leave the broker:

* per message (Receive, Subscribe): ``Grant`` tuples, rows converted one
  column at a time (``rows_from_batch``);
* as one Arrow batch (ReceiveBatch): DELIVERY_SCHEMA, the message columns as
  stored plus ``attempt`` and ``lease_expires`` filled per delivery, with
  no Python object per row (``delivery_table``).

Both carry a typed stream's values as JSON bytes (typed_values.py), as every
group delivery does (docs/typed-streams.md, "Groups").
"""

from __future__ import annotations

from itertools import repeat
from typing import NamedTuple, TypeAlias

import numpy as np
import pyarrow as pa

from npstream.broker.groups.leases import DeliveryRow
from npstream.broker.groups.tuning import COMBINE_PARTS_ABOVE
from npstream.broker.groups.typed_values import json_values, untyped_batch
from npstream.proto.schema import DELIVERY_SCHEMA, HEADERS_TYPE, MESSAGE_SCHEMA

__all__ = ["Delivered", "Grant", "Rows", "batch_from_rows", "delivery_table", "grants",
           "rows_from_batch"]

# The rows of a run of offsets: a stored batch, or rows as Python values.
Rows: TypeAlias = pa.RecordBatch | list[DeliveryRow]


class Grant(NamedTuple):
    """One delivery made by ``receive``: the message, its attempt number, its lease end."""

    row: DeliveryRow
    attempt: int
    expires_ms: int


class Delivered(NamedTuple):
    """``size`` leased messages with one attempt number and lease end, and their rows.

    Rows, not offset ranges: the fresh rows of a group ordered by key come
    with holes (held messages), and the redeliveries of one lease may be far
    apart, yet each is one group of parts here.
    """

    size: int
    attempt: int
    expires_ms: int
    parts: list[Rows]


def rows_from_batch(batch: pa.RecordBatch) -> list[DeliveryRow]:
    """The rows of a stored record batch, converted one column at a time.

    A typed stream's value (a struct) becomes each record's JSON bytes
    (typed_values.py).
    """
    headers = [dict(h) if h else {} for h in batch.column("headers").to_pylist()]
    value = batch.column("value")
    return list(map(tuple.__new__, repeat(DeliveryRow), zip(  # no Python call per row
        batch.column("offset").to_pylist(),
        batch.column("id").to_pylist(),
        batch.column("key").to_pylist(),
        json_values(value) if pa.types.is_struct(value.type) else value.to_pylist(),
        headers,
        batch.column("timestamp").view(pa.int64()).to_pylist(),  # same buffer, no cast
        strict=True,
    )))


def batch_from_rows(rows: list[DeliveryRow]) -> pa.RecordBatch:
    """Rows kept as Python values (a lone message) as a MESSAGE_SCHEMA batch."""
    return pa.RecordBatch.from_arrays([
        pa.array([r.offset for r in rows], pa.int64()),
        pa.array([r.id for r in rows], pa.string()),
        pa.array([r.key for r in rows], pa.binary()),
        pa.array([r.value for r in rows], pa.binary()),
        pa.array([r.timestamp_ms for r in rows], pa.int64()).cast(
            MESSAGE_SCHEMA.field("timestamp").type),
        pa.array([list(r.headers.items()) if r.headers else None for r in rows], HEADERS_TYPE),
    ], schema=MESSAGE_SCHEMA)


def grants(delivered: list[Delivered]) -> list[Grant]:
    """Every delivery as a Grant, in the order they were leased."""
    out: list[Grant] = []
    for group in delivered:
        for part in group.parts:
            rows = part if isinstance(part, list) else rows_from_batch(part)
            out += [tuple.__new__(Grant, (row, group.attempt, group.expires_ms)) for row in rows]
    return out


def _message_batch(part: Rows) -> pa.RecordBatch:
    if isinstance(part, list):
        return batch_from_rows(part)
    if pa.types.is_struct(part.schema.field("value").type):
        return untyped_batch(part)
    return part


def delivery_table(delivered: list[Delivered]) -> pa.Table:
    """The deliveries as one DELIVERY_SCHEMA table (no Python object per row).

    ``attempt`` and ``lease_expires`` are built once for the whole table
    (each group's value repeated over its rows), not per part: building the
    two columns per part cost ~17 us each.
    """
    batches: list[pa.RecordBatch] = []
    attempts: list[int] = []
    expires: list[int] = []
    for group in delivered:
        for part in group.parts:
            batches.append(_message_batch(part))
            attempts.append(group.attempt)
            expires.append(group.expires_ms)
    counts = [batch.num_rows for batch in batches]
    total = sum(counts)
    messages = pa.Table.from_batches(batches, schema=MESSAGE_SCHEMA)
    attempt = _int_array(_ATTEMPT_TYPE, np.repeat(np.array(attempts, dtype=np.int32), counts),
                         total)
    lease_expires = _int_array(_EXPIRES_TYPE,
                               np.repeat(np.array(expires, dtype=np.int64), counts), total)
    table = pa.Table.from_arrays([*messages.columns, attempt, lease_expires],
                                 schema=DELIVERY_SCHEMA)
    if len(batches) > COMBINE_PARTS_ABOVE:  # many small parts: one batch (tuning.py)
        return table.combine_chunks()
    return table


_ATTEMPT_TYPE = DELIVERY_SCHEMA.field("attempt").type
_EXPIRES_TYPE = DELIVERY_SCHEMA.field("lease_expires").type


def _int_array(arrow_type: pa.DataType, values: np.ndarray, length: int) -> pa.Array:
    """``values`` (int32/int64 matching ``arrow_type``'s width) as an Arrow array, no copy."""
    return pa.Array.from_buffers(arrow_type, length, [None, pa.py_buffer(values)])

"""The fixed Arrow schemas shared by the broker, the client and the Spark connector.

Every stored batch, every fetched batch and every batch handed to Spark uses
MESSAGE_SCHEMA, so data moves from disk to Spark without per-row work. The
schema is stored once per segment set (docs/format.md), not per batch.
Publishers send PUBLISH columns: only ``value`` is required.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = [
    "DELIVERY_SCHEMA",
    "HEADERS_TYPE",
    "MESSAGE_SCHEMA",
    "PUBLISH_COLUMNS",
    "normalize_publish_table",
]

HEADERS_TYPE = pa.map_(pa.string(), pa.binary())

MESSAGE_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary(), nullable=False),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("headers", HEADERS_TYPE),
    ]
)

# A shared group's deliveries as one Arrow batch (ReceiveBatch): the messages
# (typed streams' values as JSON bytes, as every group delivery carries them)
# plus each one's delivery attempt (1 on the first) and lease end.
DELIVERY_SCHEMA = MESSAGE_SCHEMA.append(pa.field("attempt", pa.int32(), nullable=False)).append(
    pa.field("lease_expires", pa.timestamp("ms", tz="UTC"), nullable=False))

# Columns a publisher may send, with the type each is converted to.
PUBLISH_COLUMNS: dict[str, pa.DataType] = {
    "value": pa.binary(),
    "id": pa.string(),
    "key": pa.binary(),
    "headers": HEADERS_TYPE,
}


def normalize_publish_table(data: pa.Table | pa.RecordBatch) -> pa.Table:
    """Return data with exactly the PUBLISH_COLUMNS it has, cast to their types.

    Strings are accepted for ``value`` and ``key`` (cast to their UTF-8 bytes),
    large_binary/large_string as well. A struct ``value`` (a record of a typed
    stream's schema, docs/typed-streams.md) is kept as it is: the broker
    checks it against the stream's schema. Raises ValueError naming the
    column when ``value`` is missing or contains nulls, or when a column is
    unknown or cannot be cast.
    """
    table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
    unknown = [name for name in table.column_names if name not in PUBLISH_COLUMNS]
    if unknown:
        raise ValueError(
            f"unknown publish column(s) {unknown}; accepted: {sorted(PUBLISH_COLUMNS)}"
        )
    if "value" not in table.column_names:
        raise ValueError("publish data has no 'value' column; it is required")
    arrays: list[pa.ChunkedArray] = []
    fields: list[pa.Field] = []
    for name, target in PUBLISH_COLUMNS.items():
        if name not in table.column_names:
            continue
        column = table.column(name)
        if name == "value" and pa.types.is_struct(column.type):
            target = column.type  # a typed stream's record: checked by the broker
        if column.type != target:
            try:
                column = column.cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(
                    f"publish column '{name}' has type {column.type}, expected {target}: {exc}"
                ) from exc
        if name == "value" and column.null_count:
            raise ValueError(f"publish column 'value' has {column.null_count} null(s)")
        arrays.append(column)
        fields.append(pa.field(name, target, nullable=name != "value"))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

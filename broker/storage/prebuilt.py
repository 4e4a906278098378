"""Frames built before their offsets are known: payloads stamped in place when appended.

The exactly-once sink stages rows on the broker long before its commit
decides where they go. Staging them already as frame payloads (Arrow IPC
record-batch messages in the stored schema, the bytes a segment stores) lets the
commit write those bytes instead of decoding, re-assembling and re-encoding
every row a second time: only the ``offset`` and ``timestamp`` columns depend
on the append, and both are fixed-width buffers at known places in the
payload, so the commit overwrites them (16 bytes a row) and computes the
frame header and CRC. Ids must therefore be final before the commit (the
sink fills missing ones when it stages).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from npstream.proto.schema import MESSAGE_SCHEMA

__all__ = ["PrebuiltFrame", "stamp_payload", "stamp_ranges"]

_OFFSET_COLUMN = MESSAGE_SCHEMA.get_field_index("offset")
_TIMESTAMP_COLUMN = MESSAGE_SCHEMA.get_field_index("timestamp")


@dataclass(frozen=True)
class PrebuiltFrame:
    """One frame payload waiting for its offsets.

    ``payload`` is a *writable* buffer (e.g. a slice of a copy-on-write mmap)
    holding one stored-batch message (in the schema of ``schema_version``)
    with ``count`` rows whose ids are final; ``flags`` are the frame flags
    (FLAG_PRODUCER_IDS when a row carries a producer id).
    """

    payload: memoryview
    count: int
    flags: int = 0
    max_message_bytes: int = 0  # largest message (value + key + headers), for size checks
    # The value schema version the payload is in (0: untyped, MESSAGE_SCHEMA); a typed
    # stream's frames are its stored schema of that version (value_schemas.py).
    schema_version: int = 0


def stamp_payload(payload: memoryview, base_offset: int, timestamp_ms: int,
                  schema: pa.Schema = MESSAGE_SCHEMA) -> pa.RecordBatch:
    """Overwrite the payload's offsets with base_offset.. and every timestamp with timestamp_ms.

    Returns the stamped batch (zero copy over ``payload``). ValueError when the
    payload is not a batch of ``schema`` (MESSAGE_SCHEMA, or a typed stream's
    stored schema of the frame's version) whose offset and timestamp columns
    are plain non-null buffers (what build_message_batch + serialize produce).
    """
    batch, ((offsets_at, _), (timestamps_at, _)) = stamp_ranges(payload, schema)
    rows = batch.num_rows
    np.frombuffer(payload, dtype=np.int64, count=rows, offset=offsets_at)[:] = np.arange(
        base_offset, base_offset + rows, dtype=np.int64)
    np.frombuffer(payload, dtype=np.int64, count=rows, offset=timestamps_at)[:] = timestamp_ms
    return batch


def stamp_ranges(payload: memoryview | pa.Buffer, schema: pa.Schema = MESSAGE_SCHEMA,
                 ) -> tuple[pa.RecordBatch, list[tuple[int, int]]]:
    """The payload's batch (zero copy) and the (position, length) of its offset and
    timestamp buffers: what stamping overwrites. ValueError as stamp_payload.

    Only the value column's type differs between MESSAGE_SCHEMA and a typed
    stream's stored schemas, so the two columns are found at the same index.
    """
    buffer = payload if isinstance(payload, pa.Buffer) else pa.py_buffer(payload)
    try:
        batch = ipc.read_record_batch(buffer, schema)
    except (pa.ArrowInvalid, OSError, EOFError) as exc:  # EOFError: no message at all
        raise ValueError(f"not a stored-batch payload: {exc!r}") from None
    rows = batch.num_rows
    ranges: list[tuple[int, int]] = []
    for column in (_OFFSET_COLUMN, _TIMESTAMP_COLUMN):
        array = batch.column(column)
        data = array.buffers()[1]
        if array.null_count or array.offset or data is None or data.size < 8 * rows:
            raise ValueError(f"column {MESSAGE_SCHEMA.field(column).name} of a prebuilt frame "
                             "is not a plain int64 buffer")
        ranges.append((data.address - buffer.address, 8 * rows))
    return batch, ranges

"""A frame's payload: one Arrow IPC record-batch message in its stored schema.

The schema is never stored per batch, so decoding needs it from the contract:
MESSAGE_SCHEMA (``npstream.proto.schema``) for an untyped stream's frames
(header ``schema_version`` 0), the stored schema of the frame's version
(``npstream.proto.value_schema.stored_schema``) for a typed stream's. The
broker and a same-host reader decode the same bytes the same way.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc

from npstream.proto.schema import MESSAGE_SCHEMA

__all__ = ["decode_payload"]


def decode_payload(payload: memoryview | bytes | pa.Buffer,
                   schema: pa.Schema = MESSAGE_SCHEMA) -> pa.RecordBatch:
    """The stored batch in a frame payload (zero copy over ``payload``), in ``schema``."""
    buffer = payload if isinstance(payload, pa.Buffer) else pa.py_buffer(payload)
    return ipc.read_record_batch(buffer, schema)

"""A frame's payload: one Arrow IPC record-batch message in the fixed message schema.

The schema is stored once per format, never per batch, so decoding needs it
from the contract (``npstream.proto.schema``); the broker and a same-host
reader decode the same bytes the same way.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc

from npstream.proto.schema import MESSAGE_SCHEMA

__all__ = ["decode_payload"]


def decode_payload(payload: memoryview | bytes | pa.Buffer) -> pa.RecordBatch:
    """The stored batch in a frame payload (zero copy over ``payload``)."""
    buffer = payload if isinstance(payload, pa.Buffer) else pa.py_buffer(payload)
    return ipc.read_record_batch(buffer, MESSAGE_SCHEMA)

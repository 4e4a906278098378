"""Client Arrow IPC streams decoded within the request limit and the publish memory budget.

Publish, PublishStream, PublishMany entries and sink Stage (over gRPC or from
an inbox file) carry Arrow IPC streams. The publish budget (budget.py) admits
a request by its wire bytes, and gRPC bounds those by
``grpc_max_message_bytes``; but an IPC stream may be compressed (zstd, lz4),
and 35 KB decoded to 1 GiB, stored, with the broker's memory growing by
gigabytes per request. The decoded size is in the stream's metadata
(npstream.proto.ipc_size), so it is checked before anything is decompressed:

* a stream decoding to more than ``limit`` (the broker's
  ``grpc_max_message_bytes``: what an uncompressed request may carry) is
  refused with INVALID_ARGUMENT, nothing decoded or stored;
* what it decodes to beyond its wire bytes is admitted in the publish budget
  like the request's own bytes, held until the caller's ``room`` (an
  ExitStack around the write) closes: OVERLOADED when it does not fit.
"""

from __future__ import annotations

from contextlib import ExitStack

import pyarrow as pa

from npstream.broker.errors import InvalidArgumentError
from npstream.broker.rpc.budget import PublishBudget
from npstream.proto.ipc_size import decoded_size

__all__ = ["decode_arrow_stream"]


def decode_arrow_stream(data: bytes | memoryview | pa.Buffer, what: str, *, limit: int,
                        budget: PublishBudget, held: int, room: ExitStack) -> pa.Table:
    """The table of the IPC stream ``data`` (its buffers views into ``data`` when uncompressed).

    ``what`` names it in errors ("arrow_stream for stream 'orders'"); ``held``:
    the budget bytes the call holds already (its wire bytes).
    """
    buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    try:
        size = decoded_size(buffer)
    except ValueError as exc:
        raise InvalidArgumentError(f"{what} is not a valid Arrow IPC stream: {exc}") from None
    if size > limit:
        raise InvalidArgumentError(
            f"{what} decodes to {size} bytes ({buffer.size} sent, compressed), over the "
            f"broker's limit of {limit} bytes per request (grpc_max_message_bytes); nothing "
            "was decoded or stored: send it in smaller requests")
    extra = size - buffer.size
    if extra > 0:
        room.enter_context(budget.admitted(extra, what, held=held))
    try:
        return pa.ipc.open_stream(buffer).read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise InvalidArgumentError(f"{what} is not a valid Arrow IPC stream: {exc}") from None

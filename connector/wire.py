"""Protobuf wire bytes for messages whose big bytes fields are appended without extra copies.

Building a message with a multi-megabyte bytes field copies the data into the
message, and serializing copies it again; on the hot paths (a publish request's
Arrow IPC stream, a ReadRange reply's stored batches) those copies were most
of the CPU. Protobuf parses the concatenation of two encodings of a message as
their merge, and a length-delimited field is just a tag, a varint length and
the bytes, so the small fields are serialized by protobuf and the big ones are
joined after them, each copied once. A parser sees exactly the message that
protobuf itself would have produced.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import Message

__all__ = ["encode_with_bytes", "varint"]

_LENGTH_DELIMITED = 2


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_with_bytes(message: Message, field: str, values: Iterable[object]) -> bytes:
    """Wire bytes of ``message`` with ``values`` (bytes-like) set as its bytes ``field``.

    ``field`` is a ``bytes`` or ``repeated bytes`` field left unset in
    ``message``; a singular field takes one value.
    """
    number = message.DESCRIPTOR.fields_by_name[field].number
    tag = varint((number << 3) | _LENGTH_DELIMITED)
    parts: list[object] = [message.SerializeToString()]
    for value in values:
        view = memoryview(value)  # type: ignore[arg-type]
        parts += (tag, varint(view.nbytes), view)
    return b"".join(parts)  # type: ignore[arg-type]

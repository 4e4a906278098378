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

import ctypes
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar, cast

import pyarrow as pa
from google.protobuf.message import DecodeError, Message

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer  # bytes, memoryview, mmap, pyarrow.Buffer...

__all__ = ["arrow_stream_buffer", "encode_with_arrow_stream", "encode_with_bytes", "field_bytes",
           "split_bytes_field", "varint"]

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5

M = TypeVar("M", bound=Message)


def arrow_stream_buffer(table: pa.Table | pa.RecordBatch) -> pa.Buffer:
    """An Arrow IPC stream (schema + batches), the format of every ``arrow_stream`` field.

    The table's buffers are copied once, into the returned Arrow buffer;
    nothing copies it into a ``bytes`` object (``encode_with_bytes`` appends it).
    """
    sink = pa.BufferOutputStream()
    _write_stream(sink, table)
    return sink.getvalue()


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _bytes_field_tag(message: Message, field: str) -> bytes:
    """The wire tag of ``message``'s length-delimited ``field``."""
    number = message.DESCRIPTOR.fields_by_name[field].number
    return varint((number << 3) | _LENGTH_DELIMITED)


def encode_with_bytes(message: Message, field: str, values: Iterable[ReadableBuffer]) -> bytes:
    """Wire bytes of ``message`` with ``values`` (bytes-like) set as its bytes ``field``.

    ``field`` is a ``bytes`` or ``repeated bytes`` field left unset in
    ``message``; a singular field takes one value.
    """
    tag = _bytes_field_tag(message, field)
    parts: list[ReadableBuffer] = [message.SerializeToString()]
    for value in values:
        view = memoryview(value)
        parts += (tag, varint(view.nbytes), view)
    return b"".join(parts)


def encode_with_arrow_stream(message: Message, field: str,
                             table: pa.Table | pa.RecordBatch) -> bytes:
    """``encode_with_bytes(message, field, [arrow_stream_buffer(table)])``, with one copy less.

    The Arrow IPC stream is written straight into the returned ``bytes``
    object, behind the message's other fields: the rows are copied once
    (``encode_with_bytes`` copies them into an Arrow buffer, then into the
    bytes; gRPC's own copy into its send buffer follows either way, as it
    takes only ``bytes``). The stream's size is found first by writing it to
    a counting sink, which copies nothing. CPython only (the bytes object is
    allocated uninitialized through the C API and filled before anything else
    sees it, as C extensions build bytes); elsewhere it falls back to the join.
    """
    if _new_bytes is None:
        return encode_with_bytes(message, field, [arrow_stream_buffer(table)])
    counter = pa.MockOutputStream()
    _write_stream(counter, table)
    size = counter.size()
    prefix = message.SerializeToString() + _bytes_field_tag(message, field) + varint(size)
    out = _new_bytes(None, len(prefix) + size)  # never the shared empty/1-byte singletons
    address = id(out) + _BYTES_DATA
    ctypes.memmove(address, prefix, len(prefix))
    sink = pa.FixedSizeBufferWriter(pa.py_buffer(
        (ctypes.c_char * size).from_address(address + len(prefix))))  # bounds-checked writes
    _write_stream(sink, table)
    if sink.tell() != size:  # the counting pass and the real one disagree: never expected
        return encode_with_bytes(message, field, [arrow_stream_buffer(table)])
    return out


def _write_stream(sink: pa.NativeFile, table: pa.Table | pa.RecordBatch) -> None:
    with pa.ipc.new_stream(sink, table.schema) as writer:
        if isinstance(table, pa.RecordBatch):
            writer.write_batch(table)
        else:
            writer.write_table(table)


def _uninitialized_bytes() -> tuple[Callable[[None, int], bytes] | None, int]:
    """CPython's PyBytes_FromStringAndSize and the offset of a bytes object's data.

    (None, 0) where either is not there or fails a self-check.
    """
    try:
        new = ctypes.pythonapi.PyBytes_FromStringAndSize
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
        data = bytes.__basicsize__ - 1  # offsetof(PyBytesObject, ob_sval)
        probe = new(None, 8)
        ctypes.memmove(id(probe) + data, b"npstream", 8)
        if probe != b"npstream" or len(probe) != 8:
            return None, 0
    except (AttributeError, TypeError, ValueError, OSError):
        return None, 0
    return cast("Callable[[None, int], bytes]", new), data


_new_bytes, _BYTES_DATA = (_uninitialized_bytes() if sys.implementation.name == "cpython"
                           else (None, 0))


def _read_varint(view: memoryview, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(view) or shift > 63:
            raise DecodeError("truncated or overlong varint")
        byte = view[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def _fields(view: memoryview) -> Iterator[tuple[int, int, int, int, int]]:
    """(number, wire type, start, value start, end) of each top-level field of a message.

    Raises DecodeError for a bad varint or wire type; whether a field's end
    lies within ``view`` is for the caller to check (each reports it its way).
    """
    position = 0
    while position < len(view):
        start = position
        key, position = _read_varint(view, position)
        wire_type, number = key & 7, key >> 3
        if wire_type == _VARINT:
            _, end = _read_varint(view, position)
        elif wire_type == _FIXED64:
            end = position + 8
        elif wire_type == _FIXED32:
            end = position + 4
        elif wire_type == _LENGTH_DELIMITED:
            length, position = _read_varint(view, position)
            end = position + length
        else:
            raise DecodeError(f"unsupported wire type {wire_type}")
        yield number, wire_type, start, position, end
        position = end


def split_bytes_field(raw: bytes, message_type: type[M], field: str,
                      *, bail_on: str | None = None) -> tuple[M, list[memoryview]]:
    """Parse ``raw`` as ``message_type`` but hand out ``field``'s values as views into ``raw``.

    The receiving twin of ``encode_with_bytes``: parsing a message copies its
    bytes fields into it, and reading them copies them again; here the big
    field is never copied. The other fields are parsed by protobuf. A
    ``bail_on`` field (a repeated message field that may hold many entries)
    makes it parse the whole message normally instead of walking it here.
    Raises DecodeError for malformed input.
    """
    descriptor = message_type.DESCRIPTOR
    wanted = descriptor.fields_by_name[field].number
    bail = descriptor.fields_by_name[bail_on].number if bail_on else -1
    view = memoryview(raw)
    rest: list[memoryview] = []
    values: list[memoryview] = []
    for number, wire_type, start, value_start, end in _fields(view):
        if number == bail:
            return _parsed_whole(raw, message_type, field)
        ours = number == wanted and wire_type == _LENGTH_DELIMITED
        if end > len(view):
            raise DecodeError(f"field {field} runs past the end of the message" if ours
                              else "truncated message")
        if ours:
            values.append(view[value_start:end])
        else:
            rest.append(view[start:end])
    return message_type.FromString(b"".join(rest)), values


def field_bytes(raw: bytes | memoryview, number: int) -> memoryview | None:
    """The value of length-delimited field ``number`` of a message's wire bytes, not parsed.

    The last occurrence, as protobuf's merge rule reads a singular field;
    None when absent or when the bytes are malformed (the parser that reads
    the message later reports that). Only walks the top-level fields, so
    finding a request's stream name costs a few steps however big its data
    (a cluster member routes every request by it, npstream.broker.cluster).
    """
    view = memoryview(raw)
    found: memoryview | None = None
    try:
        for field_number, wire_type, _start, value_start, end in _fields(view):
            if end > len(view):
                return None
            if field_number == number and wire_type == _LENGTH_DELIMITED:
                found = view[value_start:end]
    except DecodeError:
        return None
    return found


def _parsed_whole(raw: bytes, message_type: type[M],
                  field: str) -> tuple[M, list[memoryview]]:
    """``split_bytes_field``'s answer by a plain protobuf parse (``field`` stays set in it)."""
    message = message_type.FromString(raw)
    value = getattr(message, field)
    repeated = message_type.DESCRIPTOR.fields_by_name[field].is_repeated
    return message, [memoryview(v) for v in value] if repeated else (
        [memoryview(value)] if value else [])

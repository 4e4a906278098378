"""How many bytes an Arrow IPC stream decodes to, read from its metadata before decoding it.

An Arrow IPC stream may compress its record batches' buffers (LZ4 frame or
ZSTD, pyarrow's ``IpcWriteOptions(compression=...)``): 35 KB of zstd decoded
to 1 GiB, so a receiver that bounds the bytes it is sent bounds nothing.
The decoded size is written in the stream before any decompression: each
record-batch (and dictionary-batch) message's flatbuffer metadata lists its
body's buffers (offset, length), and in a compressed body each buffer starts
with its uncompressed length as a little-endian int64 (-1: stored as is).
``decoded_size`` adds those up, reading only the messages' metadata and
8 bytes per buffer (the Arrow columnar format spec, "Compression").

The flatbuffer walk covers the few tables needed (Message, RecordBatch,
DictionaryBatch; the schema in arrow/format/Message.fbs); pyarrow exposes
the metadata bytes but not their fields.
"""

from __future__ import annotations

import struct

import pyarrow as pa

__all__ = ["decoded_size"]

# MessageHeader union values (Message.fbs).
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3
# Field indexes of the tables read here.
_MESSAGE_HEADER_TYPE, _MESSAGE_HEADER = 1, 2
_BATCH_BUFFERS, _BATCH_COMPRESSION = 2, 3
_DICTIONARY_DATA = 1
_BUFFER_STRUCT = struct.Struct("<qq")  # Buffer { offset: long; length: long }
_INT64 = struct.Struct("<q")
_U32 = struct.Struct("<I")


class _Table:
    """A flatbuffer table at ``position`` of ``data``; bounds-checked reads (ValueError)."""

    def __init__(self, data: bytes, position: int) -> None:
        self._data = data
        self._position = position
        vtable = position - struct.unpack_from("<i", data, position)[0]
        self._vtable = vtable
        self._vtable_size = struct.unpack_from("<H", data, vtable)[0]

    def _offset(self, index: int) -> int:
        slot = 4 + 2 * index
        if slot + 2 > self._vtable_size:
            return 0
        return int(struct.unpack_from("<H", self._data, self._vtable + slot)[0])

    def has(self, index: int) -> bool:
        return self._offset(index) != 0

    def ubyte(self, index: int) -> int:
        offset = self._offset(index)
        return self._data[self._position + offset] if offset else 0

    def _target(self, index: int) -> int | None:
        offset = self._offset(index)
        if not offset:
            return None
        where = self._position + offset
        return where + int(_U32.unpack_from(self._data, where)[0])

    def table(self, index: int) -> _Table | None:
        target = self._target(index)
        return None if target is None else _Table(self._data, target)

    def structs(self, index: int, layout: struct.Struct) -> list[tuple[int, ...]]:
        target = self._target(index)
        if target is None:
            return []
        count = int(_U32.unpack_from(self._data, target)[0])
        start = target + 4
        if start + count * layout.size > len(self._data):
            raise ValueError("a vector runs past the end of the metadata")
        return [layout.unpack_from(self._data, start + i * layout.size) for i in range(count)]


def _batch_size(batch: _Table, body: pa.Buffer | None) -> int:
    """Decoded bytes of one RecordBatch's body (the sum of its buffers once decompressed)."""
    buffers = batch.structs(_BATCH_BUFFERS, _BUFFER_STRUCT)
    if not batch.has(_BATCH_COMPRESSION):
        return sum(max(length, 0) for _offset, length in buffers)
    view = memoryview(body) if body is not None else memoryview(b"")
    total = 0
    for offset, length in buffers:
        if length <= 0:
            continue
        if offset < 0 or length < 8 or offset + 8 > len(view):
            raise ValueError(f"compressed buffer at {offset} (length {length}) lies outside "
                             f"the message body of {len(view)} bytes")
        uncompressed = _INT64.unpack_from(view, offset)[0]
        total += length - 8 if uncompressed == -1 else max(uncompressed, 0)
    return total


def decoded_size(data: bytes | memoryview | pa.Buffer) -> int:
    """The bytes the record and dictionary batches of an Arrow IPC stream decode to.

    Reads only message metadata and each compressed buffer's length prefix;
    nothing is decompressed. ValueError when the stream's messages or their
    metadata are malformed: the decoder would refuse it too.
    """
    buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    total = 0
    try:
        for message in pa.ipc.MessageReader.open_stream(buffer):
            if message.type not in ("record batch", "dictionary"):
                continue
            metadata = message.metadata.to_pybytes()
            root = _Table(metadata, int(_U32.unpack_from(metadata, 0)[0]))
            header = root.table(_MESSAGE_HEADER)
            kind = root.ubyte(_MESSAGE_HEADER_TYPE)
            if header is not None and kind == _DICTIONARY_BATCH:
                header = header.table(_DICTIONARY_DATA)
            elif kind != _RECORD_BATCH:
                header = None
            if header is not None:
                total += _batch_size(header, message.body)
    except (struct.error, IndexError, OSError) as exc:  # pyarrow's own are ValueErrors
        raise ValueError(f"malformed Arrow IPC stream: {exc}") from None
    return total

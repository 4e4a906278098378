"""Kafka record batches (magic v2) to and from npstream's Arrow columns.

A Produce carries record batches: a 61-byte header (base offset, length,
CRC-32C of everything after the CRC field, attributes with the compression
codec, producer id and sequence), then the records, each a run of varints.
``decode_batches`` checks the framing, the magic and the CRC of every batch
before anything is stored, and yields one Arrow table of the publish columns
(key, value, headers); ``encode_batch`` writes stored rows back as one
uncompressed batch whose base offset is the first row's npstream offset.

The records themselves are varint-framed, so this slice walks them one at a
time in Python (left for the performance work: docs/kafka.md).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import cramjam
import crc32c
import pyarrow as pa
import zstandard

from npstream.broker.kafka.codec import Reader, Writer
from npstream.broker.kafka.errors import CodecError, UnsupportedCompressionError
from npstream.proto.schema import HEADERS_TYPE

__all__ = ["ProducedBatch", "UnsupportedCompressionError", "decode_batches", "encode_batch"]

# base offset, batch length, leader epoch, magic, crc, attributes, last offset delta,
# base timestamp, max timestamp, producer id, producer epoch, base sequence, count
_HEADER = struct.Struct(">qiibIhiqqqhii")
_CRC_START = 21  # the attributes: the CRC covers from here to the end of the batch
_LENGTH_BASE = 12  # batch length counts the bytes after the length field
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


@dataclass(frozen=True)
class ProducedBatch:
    """One record batch of a Produce: its rows and what the idempotence work will need."""

    rows: pa.Table  # key, value, headers: npstream's publish columns
    producer_id: int
    base_sequence: int
    transactional: bool


def _snappy(data: memoryview) -> bytes:
    """Raw snappy (librdkafka) or the Java client's xerial framing of snappy blocks."""
    if bytes(data[:8]) != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(data))
    r = Reader(data, 16)  # magic, then the framing's version and compatible version
    blocks = []
    while r.remaining():
        blocks.append(bytes(cramjam.snappy.decompress_raw(r.take(r.fixed("int32")))))
    return b"".join(blocks)


def _decompress(codec: int, data: memoryview) -> bytes:
    if codec == 0:
        return bytes(data)
    try:
        if codec == 1:
            return gzip.decompress(data)
        if codec == 2:
            return _snappy(data)
        if codec == 3:  # Kafka's lz4 is the LZ4 frame format
            return bytes(cramjam.lz4.decompress(data))
        if codec == 4:
            return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    except (OSError, EOFError, zlib.error, ValueError, cramjam.DecompressionError) as exc:
        raise CodecError(f"{_COMPRESSION_NAMES[codec]} records do not decompress: {exc}") \
            from None
    raise UnsupportedCompressionError(
        f"record batch compression {codec} is not supported; "
        f"supported: none, gzip, snappy, lz4, zstd")


def _bytes(r: Reader) -> bytes | None:
    n = r.varint()
    return None if n < 0 else bytes(r.take(n))


def _records(data: bytes, count: int) -> tuple[list[bytes | None], list[bytes],
                                                list[list[tuple[str, bytes | None]] | None]]:
    """The records' keys, values and headers (one Python step per record: module doc)."""
    r = Reader(data)
    keys: list[bytes | None] = []
    values: list[bytes] = []
    headers: list[list[tuple[str, bytes | None]] | None] = []
    for index in range(count):
        length = r.varint()
        end = r.pos + length
        if length < 0 or end > len(r.buf):
            raise CodecError(f"record {index}: length {length} past the batch's end")
        r.take(1)  # attributes (unused)
        r.varint()  # timestamp delta: npstream stamps its append time
        r.varint()  # offset delta: npstream assigns the offsets
        keys.append(_bytes(r))
        value = _bytes(r)
        values.append(b"" if value is None else value)  # a tombstone is an empty value
        pairs: list[tuple[str, bytes | None]] = []
        for _ in range(r.varint()):
            name = _bytes(r)
            if name is None:
                raise CodecError(f"record {index}: a header without a key")
            try:
                pairs.append((name.decode("utf-8"), _bytes(r)))
            except UnicodeDecodeError:
                raise CodecError(f"record {index}: a header key is not UTF-8") from None
        headers.append(pairs or None)
        if r.pos != end:
            raise CodecError(f"record {index}: length {length} does not match its fields")
    if r.remaining():
        raise CodecError(f"{r.remaining()} bytes after the batch's {count} records")
    return keys, values, headers


def decode_batches(records: bytes) -> Iterator[ProducedBatch]:
    """Every batch of a Produce's records, checked; CodecError on the first bad one."""
    view = memoryview(records)
    pos = 0
    while pos < len(view):
        if len(view) - pos < _HEADER.size:
            raise CodecError(f"record batch at byte {pos} is truncated")
        (_base, length, _epoch, magic, crc, attributes, _last_delta, _base_ts, _max_ts,
         producer_id, _producer_epoch, base_sequence, count) = _HEADER.unpack_from(view, pos)
        end = pos + _LENGTH_BASE + length
        if magic != 2:
            raise CodecError(f"record batch magic {magic}: only v2 batches are accepted")
        if length < _HEADER.size - _LENGTH_BASE or end > len(view):
            raise CodecError(f"record batch length {length} past the request's end")
        if crc32c.crc32c(view[pos + _CRC_START:end]) != crc:
            raise CodecError("record batch CRC mismatch")
        if attributes & _CONTROL:
            raise CodecError("control batches are not accepted from producers")
        if count < 0:
            raise CodecError(f"record batch count {count}")
        body = _decompress(attributes & 0x7, view[pos + _HEADER.size:end])
        keys, values, headers = _records(body, count)
        rows = pa.table({
            "value": pa.array(values, pa.binary()),
            "key": pa.array(keys, pa.binary()),
            "headers": pa.array(headers, HEADERS_TYPE),
        })
        yield ProducedBatch(rows, producer_id, base_sequence,
                            bool(attributes & _TRANSACTIONAL))
        pos = end


def _put_bytes(w: Writer, value: bytes | None) -> None:
    if value is None:
        w.varint(-1)
    else:
        w.varint(len(value))
        w.parts.append(value)


def encode_batch(rows: pa.Table) -> bytes:
    """Rows of MESSAGE_SCHEMA (offset, key, value, timestamp, headers) as one v2 batch.

    Offsets are consecutive within a stored range, so one batch with deltas
    from the first row holds them; timestamps go out as LogAppendTime, the
    time npstream stored them.
    """
    offsets = rows.column("offset").to_pylist()
    stamps = rows.column("timestamp").cast(pa.int64()).to_pylist()
    keys = rows.column("key").to_pylist()
    values = rows.column("value").to_pylist()
    headers = rows.column("headers").to_pylist()
    base_offset, base_ts = offsets[0], stamps[0]
    body = Writer()
    for offset, stamp, key, value, pairs in zip(offsets, stamps, keys, values, headers,
                                                strict=True):
        record = Writer()
        record.parts.append(b"\x00")
        record.varint(stamp - base_ts)
        record.varint(offset - base_offset)
        _put_bytes(record, key)
        _put_bytes(record, value)
        record.varint(len(pairs or ()))
        for name, header_value in pairs or ():
            _put_bytes(record, name.encode("utf-8"))
            _put_bytes(record, header_value)
        encoded = bytes(record)
        body.varint(len(encoded))
        body.parts.append(encoded)
    records = bytes(body)
    log_append_time = 0x08
    after_crc = struct.pack(">hiqqqhii", log_append_time, offsets[-1] - base_offset, base_ts,
                            max(stamps), -1, -1, -1, len(offsets)) + records
    length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, the rest
    return (struct.pack(">qiib", base_offset, length, 0, 2)
            + struct.pack(">I", crc32c.crc32c(after_crc)) + after_crc)

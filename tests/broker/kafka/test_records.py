"""Record batches v2: what a producer sends decodes into exactly its keys, values and
headers; a batch with a bad CRC, magic or length is refused whole."""

from __future__ import annotations

import gzip
import struct

import cramjam
import crc32c
import pyarrow as pa
import pytest
import zstandard

from npstream.broker.kafka.errors import CodecError
from npstream.broker.kafka.records import (
    UnsupportedCompressionError,
    decode_batches,
    encode_batch,
)
from npstream.proto.schema import MESSAGE_SCHEMA

ROWS = pa.Table.from_pylist([
    {"offset": 40 + i, "id": f"id{i}", "key": None if i == 1 else f"k{i}".encode(),
     "value": b"v" * i, "timestamp": 1_700_000_000_000 + i,
     "headers": [("h", b"x"), ("empty", None)] if i % 2 else None}
    for i in range(5)], schema=MESSAGE_SCHEMA)


def _recompress(batch: bytes, codec: int, compress) -> bytes:
    """The same batch with its records compressed by ``codec`` (CRC recomputed)."""
    header = bytearray(batch[:61])
    body = compress(batch[61:])
    attributes = (struct.unpack_from(">h", header, 21)[0] & ~0x7) | codec
    struct.pack_into(">h", header, 21, attributes)
    struct.pack_into(">i", header, 8, 61 - 12 + len(body))
    out = bytes(header) + body
    return out[:17] + struct.pack(">I", crc32c.crc32c(out[21:])) + out[21:]


def _xerial(data: bytes) -> bytes:
    """The Java client's snappy framing: magic, versions, then length-prefixed blocks."""
    block = bytes(cramjam.snappy.compress_raw(data))
    return b"\x82SNAPPY\x00" + struct.pack(">iii", 1, 1, len(block)) + block


@pytest.mark.parametrize(("codec", "compress"), [
    (0, bytes), (1, gzip.compress), (4, zstandard.ZstdCompressor().compress),
    (2, lambda d: bytes(cramjam.snappy.compress_raw(d))), (2, _xerial),
    (3, lambda d: bytes(cramjam.lz4.compress(d)))])
def test_decode_batches_encoded_rows_give_back_keys_values_headers(codec, compress):
    batch = _recompress(encode_batch(ROWS), codec, compress)
    (decoded,) = list(decode_batches(batch + b""))
    assert decoded.rows.to_pylist() == [
        {"value": r["value"], "key": r["key"], "headers": r["headers"]}
        for r in ROWS.to_pylist()]


def test_encode_batch_base_offset_and_deltas_are_npstream_offsets():
    batch = encode_batch(ROWS.slice(2))
    base, _length, _epoch, magic = struct.unpack_from(">qiib", batch)
    assert (base, magic) == (42, 2)
    assert struct.unpack_from(">i", batch, 23)[0] == 2  # last offset delta
    assert crc32c.crc32c(batch[21:]) == struct.unpack_from(">I", batch, 17)[0]


def test_decode_batches_two_batches_in_one_produce_both_decoded():
    batch = encode_batch(ROWS)
    assert [b.rows.num_rows for b in decode_batches(batch + batch)] == [5, 5]


@pytest.mark.parametrize(("position", "message"), [
    (16, "magic 3"), (30, "CRC mismatch"), (8, "past the request's end")])
def test_decode_batches_corrupt_batch_codec_error(position, message):
    batch = bytearray(encode_batch(ROWS))
    batch[position] = 3 if position == 16 else batch[position] ^ 0x7F
    with pytest.raises(CodecError, match=message):
        list(decode_batches(bytes(batch)))


def test_decode_batches_unknown_codec_unsupported_compression_error():
    batch = _recompress(encode_batch(ROWS), 5, bytes)
    with pytest.raises(UnsupportedCompressionError, match="compression 5 is not supported"):
        list(decode_batches(batch))


def test_decode_batches_bad_snappy_codec_error():
    batch = _recompress(encode_batch(ROWS), 2, lambda d: b"\xff" * 10)
    with pytest.raises(CodecError, match="snappy records do not decompress"):
        list(decode_batches(batch))


def test_decode_batches_truncated_codec_error():
    with pytest.raises(CodecError, match="truncated"):
        list(decode_batches(encode_batch(ROWS)[:40]))

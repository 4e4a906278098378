"""decoded_size: an Arrow IPC stream's decoded bytes, read before anything is decompressed."""

from __future__ import annotations

import pyarrow as pa
import pytest

from npstream.proto.ipc_size import decoded_size


def _ipc(table: pa.Table, compression: str | None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=40)
    return sink.getvalue().to_pybytes()


def _buffer_bytes(table: pa.Table) -> int:
    """What the decoded table's buffers hold (dictionaries included)."""
    total = 0
    for column in table.columns:
        for chunk in column.chunks:
            arrays = [chunk, chunk.dictionary] if isinstance(chunk, pa.DictionaryArray) else [chunk]
            total += sum(b.size for a in arrays for b in a.buffers() if b is not None)
    return total


TABLE = pa.table({
    "value": pa.array([b"x" * (i % 500) for i in range(100)], pa.binary()),
    "id": pa.array([None if i % 7 == 0 else f"id-{i}" for i in range(100)]),
    "kind": pa.array(["a", "b", "c", "d"] * 25).dictionary_encode(),
})


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_decoded_size_is_what_the_batches_decode_to(compression: str | None) -> None:
    data = _ipc(TABLE, compression)
    decoded = pa.ipc.open_stream(data).read_all()
    # Dictionaries are sent once but referenced by every batch: counted once.
    dictionary = sum(b.size for b in decoded.column("kind").chunk(0).dictionary.buffers()
                     if b is not None)
    expected = _buffer_bytes(decoded) - dictionary * (decoded.column("kind").num_chunks - 1)
    assert decoded_size(data) == expected


def test_decoded_size_of_a_compressed_bomb_is_known_from_a_few_kilobytes() -> None:
    data = _ipc(pa.table({"value": [b"\0" * (64 << 20)] * 4}), "zstd")
    assert len(data) < 64 << 10
    assert decoded_size(data) == 4 * (64 << 20) + 4 * 5


@pytest.mark.parametrize("data", [b"\xff\xff\xff\xff\x7f\xff\xff\xff" + b"\0" * 64,
                                  b"garbage" * 5, _ipc(TABLE, "zstd")[:300]])
def test_decoded_size_of_malformed_data_is_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        decoded_size(data)

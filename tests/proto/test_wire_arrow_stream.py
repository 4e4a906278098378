"""encode_with_arrow_stream: the IPC stream written in place gives encode_with_bytes's bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from npstream.proto import pb, wire
from npstream.proto.schema import DELIVERY_SCHEMA, MESSAGE_SCHEMA
from npstream.proto.wire import (
    arrow_stream_buffer,
    encode_with_arrow_stream,
    encode_with_bytes,
    split_bytes_field,
)


def deliveries(rows: int, size: int, offset: int = 0) -> pa.Table:
    """A DELIVERY_SCHEMA table that is a slice of a larger batch (as a group delivers)."""
    total = offset + rows
    messages = pa.RecordBatch.from_arrays([
        pa.array(np.arange(total), pa.int64()),
        pa.array([f"id{i}" for i in range(total)], pa.string()),
        pa.array([b"k%d" % i if i % 3 else None for i in range(total)], pa.binary()),
        pa.array([bytes([i % 256]) * size for i in range(total)], pa.binary()),
        pa.array(np.arange(total), pa.int64()).cast(MESSAGE_SCHEMA.field("timestamp").type),
        pa.array([[("h", b"v")] if i % 2 else None for i in range(total)],
                 MESSAGE_SCHEMA.field("headers").type),
    ], schema=MESSAGE_SCHEMA).slice(offset, rows)
    return pa.Table.from_arrays([
        *pa.Table.from_batches([messages]).columns,
        pa.array(np.ones(rows, np.int32)),
        pa.array(np.arange(rows), pa.int64()).cast(DELIVERY_SCHEMA.field("lease_expires").type),
    ], schema=DELIVERY_SCHEMA)


@pytest.mark.parametrize(("rows", "size", "offset"),
                         [(1, 0, 0), (3, 10, 5), (1000, 1024, 2500), (200, 100_000, 7)])
def test_same_bytes_as_the_join(rows, size, offset):
    table = deliveries(rows, size, offset)
    head = pb.ReceiveBatchResponse(count=rows)
    raw = encode_with_arrow_stream(head, "arrow_stream", table)
    assert type(raw) is bytes
    assert raw == encode_with_bytes(head, "arrow_stream", [arrow_stream_buffer(table)])
    parsed, views = split_bytes_field(raw, pb.ReceiveBatchResponse, "arrow_stream")
    assert parsed.count == rows
    assert pa.ipc.open_stream(views[0]).read_all().equals(table)


def test_a_record_batch_and_a_table_of_several_chunks():
    table = pa.concat_tables([deliveries(10, 5), deliveries(7, 3, 2)])
    head = pb.DeliveryBatch(count=17)
    raw = encode_with_arrow_stream(head, "arrow_stream", table)
    assert raw == encode_with_bytes(head, "arrow_stream", [arrow_stream_buffer(table)])
    batch = table.combine_chunks().to_batches()[0]
    assert (encode_with_arrow_stream(head, "arrow_stream", batch)
            == encode_with_bytes(head, "arrow_stream", [arrow_stream_buffer(batch)]))


def test_results_are_independent_objects():
    """Each call fills a new bytes object: no buffer is shared or reused between replies."""
    head = pb.ReceiveBatchResponse(count=2)
    first = encode_with_arrow_stream(head, "arrow_stream", deliveries(2, 50))
    copy = bytes(bytearray(first))
    second = encode_with_arrow_stream(head, "arrow_stream", deliveries(2, 50, 9))
    assert first == copy != second
    assert hash(first) == hash(copy)  # the hash is computed from the filled bytes


def test_without_the_c_api_it_falls_back_to_the_join(monkeypatch):
    table = deliveries(5, 20)
    head = pb.ReceiveBatchResponse(count=5)
    expected = encode_with_bytes(head, "arrow_stream", [arrow_stream_buffer(table)])
    monkeypatch.setattr(wire, "_new_bytes", None)
    assert encode_with_arrow_stream(head, "arrow_stream", table) == expected

"""Request splitting and per-row offsets of publish_batch (npstream.client.batching), columnar."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest

from npstream.client.batching import (
    ROW_OVERHEAD_BYTES,
    chunk_offsets,
    encode_ipc_stream,
    encode_publish_request,
    row_sizes,
    split_rows,
)
from npstream.errors import NpstreamError
from npstream.proto import pb
from npstream.proto.schema import normalize_publish_table


def test_row_sizes_counts_value_id_key_and_headers_bytes():
    table = normalize_publish_table(pa.table({
        "value": [b"abc", b"", b"z"],
        "id": ["i", None, "id3"],
        "key": [None, b"kk", None],
        "headers": pa.array([[("h", b"12")], None, [("ab", b""), ("c", b"d")]],
                            pa.map_(pa.string(), pa.binary())),
    }))
    assert row_sizes(table).tolist() == [
        3 + 1 + 3 + ROW_OVERHEAD_BYTES,
        0 + 2 + ROW_OVERHEAD_BYTES,
        1 + 3 + 4 + ROW_OVERHEAD_BYTES,
    ]


def test_row_sizes_sliced_and_chunked_headers_stay_aligned():
    headers_type = pa.map_(pa.string(), pa.binary())
    first = pa.table({"value": [b"a", b"b"],
                      "headers": pa.array([[("x", b"1")], [("yy", b"22")]], headers_type)})
    second = pa.table({"value": [b"c"], "headers": pa.array([[("zzz", b"333")]], headers_type)})
    table = pa.concat_tables([first, second]).slice(1)
    assert table.column("headers").num_chunks == 2
    assert row_sizes(table).tolist() == [1 + 4 + ROW_OVERHEAD_BYTES, 1 + 6 + ROW_OVERHEAD_BYTES]


@pytest.mark.parametrize(
    ("sizes", "target", "ranges"),
    [
        ([10, 10, 10, 10], 20, [(0, 2), (2, 4)]),
        ([10, 10, 10], 25, [(0, 2), (2, 3)]),
        ([50, 1, 1], 20, [(0, 1), (1, 3)]),
        ([1, 50, 1], 20, [(0, 1), (1, 2), (2, 3)]),
        ([], 20, []),
    ],
)
def test_split_rows_targets_bytes_and_keeps_big_rows_alone(sizes, target, ranges):
    assert split_rows(np.array(sizes, dtype=np.int64), target) == ranges


def test_split_rows_100k_rows_covers_every_row_once_in_order():
    sizes = np.full(100_000, 100, dtype=np.int64)
    ranges = split_rows(sizes, 4 * 1024 * 1024)
    assert ranges[0][0] == 0 and ranges[-1][1] == 100_000
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert len(ranges) == 3  # 10 MB of rows in 4 MiB requests


def test_chunk_offsets_stored_rows_dense_and_duplicates_get_original():
    offsets = chunk_offsets(5, 100, 3, [(1, 7), (3, 100)])
    assert offsets.tolist() == [100, 7, 101, 100, 102]


def test_chunk_offsets_all_duplicates():
    assert chunk_offsets(2, 55, 0, [(0, 3), (1, 4)]).tolist() == [3, 4]


def test_chunk_offsets_inconsistent_reply_raises():
    with pytest.raises(NpstreamError, match="broker reported 3 stored and 1 duplicate"):
        chunk_offsets(3, 0, 3, [(0, 9)])


def test_encode_ipc_stream_round_trips_with_schema():
    table = normalize_publish_table(pa.table({"value": [b"a", b"b"], "id": ["1", "2"]}))
    back = pa.ipc.open_stream(encode_ipc_stream(table)).read_all()
    assert back.equals(table)


@pytest.mark.parametrize("rows", [0, 1, 3000])
@pytest.mark.parametrize("ack", [pb.ACK_FSYNC, pb.ACK_WRITE])
def test_encode_publish_request_parses_as_the_protobuf_message(rows, ack):
    table = pa.table({"value": pa.array([b"v" * 200] * rows, pa.binary()),
                      "id": pa.array([f"i{i}" for i in range(rows)], pa.string())})
    wire = encode_publish_request("stré-am", ack, table)
    expected = pb.PublishRequest(stream="stré-am", arrow_stream=encode_ipc_stream(table), ack=ack)
    assert pb.PublishRequest.FromString(wire) == expected
    assert pa.ipc.open_stream(pb.PublishRequest.FromString(wire).arrow_stream).read_all() == table

"""The max_message_bytes size rule: the same size from Arrow columns and from Python values."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from npstream.proto.message_size import first_oversized, message_size, message_sizes
from npstream.proto.schema import HEADERS_TYPE

ROWS = [
    (b"v", None, None),
    (b"vv", b"kkk", None),
    (b"", b"", {"h": b"12", "\u00e9": b""}),  # a header name counts in UTF-8 bytes
    (b"value", None, {}),
]


def table_of(rows) -> pa.Table:
    return pa.table({
        "value": pa.array([r[0] for r in rows], pa.binary()),
        "key": pa.array([r[1] for r in rows], pa.binary()),
        "headers": pa.array([list(r[2].items()) if r[2] is not None else None for r in rows],
                            HEADERS_TYPE),
    })


def test_arrow_and_python_sizes_agree():
    expected = [message_size(*row) for row in ROWS]
    assert expected == [1, 5, 1 + 2 + 2, 5]
    assert message_sizes(table_of(ROWS)).tolist() == expected


def test_sliced_and_chunked_tables_and_missing_columns():
    table = table_of(ROWS)
    assert message_sizes(table.slice(1)).tolist() == [5, 5, 5]
    assert message_sizes(pa.concat_tables([table.slice(0, 2), table.slice(2)])).tolist() == [
        1, 5, 5, 5]
    assert message_sizes(pa.table({"value": [b"abc", b""]})).tolist() == [3, 0]
    assert message_sizes(table.slice(0, 0)).tolist() == []


@pytest.mark.parametrize("sizes", [[3, 9, 4, 10], np.array([3, 9, 4, 10])])
def test_first_oversized(sizes):
    assert first_oversized(sizes, 8) == 1
    assert first_oversized(sizes, 9) == 3
    assert first_oversized(sizes, 10) is None  # exactly the limit is accepted
    assert first_oversized(sizes, 0) is None  # 0 = no limit
    assert first_oversized(sizes[:0], 1) is None

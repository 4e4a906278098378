"""The lean small-append path stores exactly what the general (columnar) path stores."""

from __future__ import annotations

import pyarrow as pa
import pytest

from npstream.broker.errors import MessageTooLargeError
from npstream.broker.storage.append_plan import prepare_append
from npstream.broker.storage.batch_builder import build_message_batch
from npstream.broker.storage.small_append import (
    SMALL_BATCH_MAX_ROWS,
    MessageRows,
    build_stored_batch,
    prepare_rows,
)
from npstream.schema import HEADERS_TYPE

PREFIX = b"0123456789abcdef"

CASES = {
    "one value": MessageRows([b"x" * 100], [""], [None], [None]),
    "ids, keys, headers": MessageRows(
        [b"a", b"", b"ccc"], ["id-1", "", "id-3"], [b"k", None, b""],
        [{"h": b"1", "\u00e9": b"22"}, None, {}],
    ),
    "all ids": MessageRows([b"a", b"b"], ["x", "y"], [None, None], [None, None]),
    "repeated ids": MessageRows([b"a", b"b", b"c"], ["x", "y", "x"], [None] * 3, [None] * 3),
    "many rows": MessageRows([bytes([i]) * i for i in range(40)], [""] * 40, [None] * 40,
                             [None] * 40),
}


def general_table(rows: MessageRows) -> pa.Table:
    """The same rows the way the Arrow publish path receives them."""
    return pa.table({
        "value": pa.array(rows.values, pa.binary()),
        "id": pa.array([i or None for i in rows.ids], pa.string()),
        "key": pa.array(rows.keys, pa.binary()),
        "headers": pa.array([list(h.items()) if h else None for h in rows.headers],
                            HEADERS_TYPE),
    })


@pytest.mark.parametrize("name", sorted(CASES))
def test_stored_batch_is_byte_identical_to_the_general_path(name):
    rows = CASES[name]
    lean = prepare_rows(rows, "s", 1 << 20, find_repeats=True)
    general = prepare_append(general_table(rows), "s", 1 << 20, find_repeats=True)
    assert lean.table.equals(general.table)
    assert (lean.supplied is None) == (general.supplied is None)
    if lean.supplied is not None:
        assert lean.supplied.equals(general.supplied)
    assert (lean.intra is None) == (general.intra is None)
    if lean.intra is not None:
        assert lean.intra.rows.tolist() == general.intra.rows.tolist()
        assert lean.intra.first_rows.tolist() == general.intra.first_rows.tolist()
    ours = build_stored_batch(lean.table, 4096, 1_700_000_000_123, PREFIX)
    theirs = build_message_batch(general.table, 4096, 1_700_000_000_123, PREFIX)
    assert ours.serialize().to_pybytes() == theirs.serialize().to_pybytes()


def test_chunked_group_tables_are_built_like_the_general_path():
    parts = [prepare_rows(CASES[name], "s", 0, find_repeats=False).table
             for name in ("one value", "ids, keys, headers")]
    table = pa.concat_tables(parts)
    assert table.num_rows <= SMALL_BATCH_MAX_ROWS and table.column("value").num_chunks == 2
    ours = build_stored_batch(table, 7, 5, PREFIX)
    assert ours.serialize().to_pybytes() == \
        build_message_batch(table, 7, 5, PREFIX).serialize().to_pybytes()
    assert ours.column("id").to_pylist() == [
        PREFIX.decode() + f"{7:016x}", "id-1", PREFIX.decode() + f"{9:016x}", "id-3"]


def test_too_large_message_names_its_index_and_size():
    rows = MessageRows([b"a", b"bb"], ["", ""], [None, b"kkk"], [None, {"h": b"12"}])
    with pytest.raises(MessageTooLargeError) as caught:
        prepare_rows(rows, "s", 5, find_repeats=False)
    assert "message 1 for stream 's' is 8 bytes" in str(caught.value)
    prepare_rows(rows, "s", 8, find_repeats=False)  # exactly the limit is accepted

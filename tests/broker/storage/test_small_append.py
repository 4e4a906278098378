"""The lean small-append path stores exactly what the general (columnar) path stores."""

from __future__ import annotations

import pyarrow as pa
import pytest

from npstream.broker.errors import MessageTooLargeError
from npstream.broker.storage.append_plan import prepare_append
from npstream.broker.storage.batch_builder import build_message_batch
from npstream.broker.storage.small_append import (
    LoneMessage,
    MessageRows,
    build_stored_batch,
    lone_message,
    lone_payload,
    prepare_rows,
    remember_lone_template,
)
from npstream.broker.storage.tuning import LONE_TEMPLATE_MAX_BYTES, SMALL_BATCH_MAX_ROWS
from npstream.proto.schema import HEADERS_TYPE

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


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 63, 64, 100, 1000, 4096])
def test_lone_payload_is_byte_identical_to_the_built_batch(length):
    def built(value: bytes, offset: int, timestamp: int) -> bytes:
        table = prepare_rows(MessageRows([value], [""], [None], [None]), "s", 0,
                             find_repeats=False).table
        return build_stored_batch(table, offset, timestamp, PREFIX).serialize()

    # The template comes from another message of the same length at another place.
    remember_lone_template(built(b"\xff" * length, 3, 1_600_000_000_000))
    value = bytes(range(256)) * (length // 256) + bytes(range(length % 256))
    for offset, timestamp in ((0, 1), (4096, 1_700_000_000_123), (2**40 + 17, 2**45)):
        assert lone_payload(value, offset, timestamp, PREFIX) == built(value, offset, timestamp)


def test_lone_payload_needs_a_template_of_its_length():
    assert lone_payload(b"x" * (LONE_TEMPLATE_MAX_BYTES + 1), 0, 0, PREFIX) is None
    table = prepare_rows(MessageRows([b"y" * (LONE_TEMPLATE_MAX_BYTES + 1)], [""], [None],
                                     [None]), "s", 0, find_repeats=False).table
    remember_lone_template(build_stored_batch(table, 0, 0, PREFIX).serialize())
    assert lone_payload(b"x" * (LONE_TEMPLATE_MAX_BYTES + 1), 0, 0, PREFIX) is None  # too big


def test_lone_message_is_only_a_bare_single_value():
    assert lone_message(MessageRows([b"v"], [""], [None], [None]), "s", 0) == LoneMessage(b"v")
    for rows in (MessageRows([b"v"], ["id"], [None], [None]),
                 MessageRows([b"v"], [""], [b""], [None]),
                 MessageRows([b"v"], [""], [None], [{"h": b"1"}]),
                 MessageRows([b"v", b"w"], ["", ""], [None, None], [None, None])):
        assert lone_message(rows, "s", 0) is None
    with pytest.raises(MessageTooLargeError):
        lone_message(MessageRows([b"v" * 11], [""], [None], [None]), "s", 10)

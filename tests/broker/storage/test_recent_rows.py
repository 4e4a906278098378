"""StreamLog.recent_rows: the last write's rows from memory, equal to what a read returns."""

from __future__ import annotations

import pyarrow as pa

from npstream.broker.storage import AckMode
from npstream.broker.storage.appender import RECENT_MAX_BYTES
from npstream.broker.storage.results import StoredRow
from npstream.broker.storage.small_append import MessageRows


def rows(*values: bytes) -> MessageRows:
    return MessageRows(list(values), [""] * len(values), [None] * len(values),
                       [None] * len(values))


def test_recent_rows_holds_the_last_write_as_a_read_returns_it(make_storage, config):
    log = make_storage().open_log("recent", config)
    assert log.recent_rows(0) is None  # nothing written yet
    log.append(rows(b"a", b"b"), AckMode.WRITE)
    log.append(rows(b"c", b"d", b"e"), AckMode.WRITE)
    whole = log.recent_rows(2)
    assert whole is not None
    assert pa.Table.from_batches([whole]).equals(log.read_table(2, 5))
    assert log.recent_rows(3).column("value").to_pylist() == [b"d", b"e"]
    assert log.recent_rows(1) is None  # the write before: read from the file
    assert log.recent_rows(5) is None  # the end


def test_recent_rows_survives_deletion_of_the_head_but_not_truncation(
        make_storage, config, table_of):
    log = make_storage().open_log("changes", config)
    log.append(table_of(3), AckMode.WRITE)
    log.append(table_of(2, tag="x"), AckMode.WRITE)
    log.delete_before(2)  # only the start moves: rows [3, 5) are unchanged
    assert log.recent_rows(2) is None  # not in the last write
    assert log.recent_rows(4).column("value").to_pylist() == [b"x1"]
    log.truncate_to(3)  # the last write's frame goes
    assert log.recent_rows(3) is None
    assert log.recent_rows(4) is None


def test_recent_rows_is_not_kept_for_large_writes(make_storage, config, table_of):
    log = make_storage().open_log("large", config)
    size = 64 * 1024
    count = RECENT_MAX_BYTES // size + 2
    log.append(table_of([bytes(size)] * count), AckMode.WRITE)
    assert log.recent_rows(0) is None
    log.append(table_of(1), AckMode.WRITE)
    assert log.recent_rows(count).column("value").to_pylist() == [b"m0"]


def test_recent_rows_of_a_lone_message_are_its_python_values(make_storage, config, clock):
    log = make_storage().open_log("lone", config)
    log.append(rows(b"first"), AckMode.WRITE)
    log.append(rows(b"second"), AckMode.FSYNC)
    (row,) = log.recent_rows(1)
    stored = log.read_table(1, 2).to_pylist()[0]
    assert row == StoredRow(1, stored["id"], None, b"second", {}, clock.now)
    assert stored["value"] == b"second" and stored["key"] is None
    assert log.recent_rows(0) is None
    log.delete_before(2)
    assert log.recent_rows(1) is None  # below the start now

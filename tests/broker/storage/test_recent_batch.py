"""StreamLog.recent_batch: the last write's rows from memory, equal to what a read returns."""

from __future__ import annotations

import pyarrow as pa

from npstream.broker.storage import AckMode
from npstream.broker.storage.log import RECENT_MAX_BYTES
from npstream.broker.storage.small_append import MessageRows


def rows(*values: bytes) -> MessageRows:
    return MessageRows(list(values), [""] * len(values), [None] * len(values),
                       [None] * len(values))


def test_recent_batch_holds_the_last_write_as_a_read_returns_it(make_storage, config):
    log = make_storage().open_log("recent", config)
    assert log.recent_batch(0) is None  # nothing written yet
    log.append(rows(b"a", b"b"), AckMode.WRITE)
    log.append(rows(b"c", b"d", b"e"), AckMode.WRITE)
    whole = log.recent_batch(2)
    assert whole is not None
    assert pa.Table.from_batches([whole]).equals(log.read_table(2, 5))
    assert log.recent_batch(3).column("value").to_pylist() == [b"d", b"e"]
    assert log.recent_batch(1) is None  # the write before: read from the file
    assert log.recent_batch(5) is None  # the end


def test_recent_batch_survives_deletion_of_the_head_but_not_truncation(
        make_storage, config, table_of):
    log = make_storage().open_log("changes", config)
    log.append(table_of(3), AckMode.WRITE)
    log.append(table_of(2, tag="x"), AckMode.WRITE)
    log.delete_before(4)  # only the start moves: rows [3, 5) are unchanged
    assert log.recent_batch(3) is None  # below the start now
    assert log.recent_batch(4).column("value").to_pylist() == [b"x1"]
    log.truncate_to(4)
    assert log.recent_batch(4) is None
    assert log.recent_batch(3) is None


def test_recent_batch_is_not_kept_for_large_writes(make_storage, config, table_of):
    log = make_storage().open_log("large", config)
    size = 64 * 1024
    count = RECENT_MAX_BYTES // size + 2
    log.append(table_of([bytes(size)] * count), AckMode.WRITE)
    assert log.recent_batch(0) is None
    log.append(table_of(1), AckMode.WRITE)
    assert log.recent_batch(count).column("value").to_pylist() == [b"m0"]

"""LogReader: reads over the segment store's current view, stats cached per start offset."""

from __future__ import annotations

import pytest

from npstream.broker.errors import OffsetOutOfRangeError, ShuttingDownError
from npstream.broker.storage.appender import Appender
from npstream.broker.storage.log_reader import LogReader
from npstream.broker.storage.truncation import Truncation


def test_reader_reads_what_the_appender_wrote_in_the_view_it_took(open_store, config,
                                                                 table_of):
    store = open_store("reads", config)
    appender, reader = Appender(store), LogReader(store)
    appender.append(table_of(3))
    view = store.view
    appender.append(table_of(2, tag="x"))
    assert view.end == 3 and store.view is not view  # a write publishes a new view
    assert reader.read_table(0, 5).column("value").to_pylist() == [
        b"m0", b"m1", b"m2", b"x0", b"x1"]
    assert reader.read(5).count == 0
    with pytest.raises(OffsetOutOfRangeError):
        reader.read(6)


def test_stats_read_the_first_timestamp_once_per_start_offset(open_store, config, table_of,
                                                              clock):
    store = open_store("stats", config)
    appender, reader = Appender(store), LogReader(store)
    first_at = clock.now
    appender.append(table_of(2))
    clock.advance(1000)
    appender.append(table_of(2))
    stats = reader.stats()
    assert (stats.start_offset, stats.end_offset, stats.first_timestamp_ms,
            stats.last_timestamp_ms) == (0, 4, first_at, first_at + 1000)
    Truncation(store).delete_before(2)
    assert reader.stats().first_timestamp_ms == first_at + 1000


def test_reads_after_close_raise_its_error(open_store, config, table_of):
    store = open_store("closed", config)
    Appender(store).append(table_of(1))
    reader = LogReader(store)
    store.close()
    with pytest.raises(ShuttingDownError):
        reader.read(0)
    assert reader.stats().end_offset == 1  # listings still see the last view

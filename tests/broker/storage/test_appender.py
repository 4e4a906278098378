"""Appender: the one entry point, write sequences in results, no reference cycles."""

from __future__ import annotations

import gc
import weakref

from npstream.broker.storage import AckMode, FramedAppend, StreamConfig
from npstream.broker.storage.appender import Appender
from npstream.broker.storage.log import StreamLog

DEDUP = StreamConfig(max_age_ms=0, max_bytes=0, dedup_window_ms=60_000,
                     max_message_bytes=1 << 20)


def test_append_of_only_duplicates_returns_the_sequence_already_written(
        open_store, table_of):
    store = open_store("dups", DEDUP)
    appender = Appender(store)
    first = appender.append(table_of([b"a"], ids=["a"]), AckMode.WRITE)
    again = appender.append(table_of([b"a"], ids=["a"]), AckMode.WRITE)
    assert (first.write_sequence, again.write_sequence) == (1, 1)
    assert (again.first_offset, again.stored_count, again.duplicates) == (1, 0, [(0, 0)])
    assert store.written_seq == 1


def test_append_of_nothing_returns_the_end_and_the_current_sequence(open_store, config,
                                                                    table_of, clock):
    store = open_store("empty", config)
    appender = Appender(store)
    appender.append(table_of(2), AckMode.WRITE)
    result = appender.append(table_of([]))
    assert (result.first_offset, result.stored_count, result.write_sequence) == (2, 0, 1)
    assert result.timestamp_ms == clock.now
    framed = appender.append(FramedAppend([]))
    assert (framed.first_offset, framed.stored_count, framed.write_sequence) == (2, 0, 1)


def test_flusher_is_told_of_write_acked_appends_only(open_store, config, table_of):
    dirty: list[object] = []
    store = open_store("dirty", config)
    appender = Appender(store, on_dirty=dirty.append)
    appender.append(table_of(1))
    assert dirty == []
    appender.append(table_of(1), AckMode.WRITE)
    assert dirty == [store]  # the flusher fsyncs the store, which the log holds


def test_a_log_is_freed_without_garbage_collection(open_store, config, table_of):
    stream_log = StreamLog(open_store("freed", config))
    stream_log.append(table_of(2))
    freed = [weakref.ref(stream_log), weakref.ref(stream_log._appender)]
    gc.disable()
    try:
        del stream_log
        # No cycle between the log's parts (the commit queue holds its appender weakly):
        # reference counting frees them.
        assert [ref() for ref in freed] == [None, None]
    finally:
        gc.enable()

"""SegmentStore: the view it publishes, durability through write sequences, failure, close."""

from __future__ import annotations

import errno
import threading

import pytest

from npstream.broker import faults
from npstream.broker.errors import (
    DiskFullError,
    DiskIOError,
    ShuttingDownError,
    StreamNotFoundError,
)
from npstream.broker.storage import AckMode
from npstream.broker.storage.appender import Appender
from npstream.broker.storage.errors import UndoFailedError
from npstream.broker.storage.stream_files import CleanShutdown, read_clean_shutdown


def test_publish_view_wakes_waiters_and_calls_listeners_after_the_write(
        open_store, config, table_of):
    store = open_store("views", config)
    appender = Appender(store)
    seen: list[int] = []
    store.add_listener(lambda: seen.append(store.view.end))

    def broken() -> None:
        raise RuntimeError("a listener's bug")

    store.add_listener(broken)
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(store.wait_for_data(0, 30)))
    waiter.start()
    assert appender.append(table_of(2)).first_offset == 0  # the broken listener is logged
    waiter.join(10)
    assert woke == [True] and seen == [2]
    assert (store.view.start, store.view.end) == (0, 2)
    store.remove_listener(broken)
    appender.append(table_of(1))
    assert seen == [2, 3]


def test_sync_through_fsyncs_once_for_every_group_written_before(open_store, config, table_of):
    fsyncs: list[int] = []
    faults.arm("storage.fsync", lambda path, position: fsyncs.append(position))
    store = open_store("durable", config)
    appender = Appender(store)
    sequences = [appender.append(table_of(1), AckMode.WRITE).write_sequence for _ in range(3)]
    assert sequences == [1, 2, 3] and store.needs_sync() and fsyncs == []
    store.sync_through(sequences[0])
    assert len(fsyncs) == 1 and store.synced_seq == 3 and not store.needs_sync()
    store.sync_through(sequences[2])  # covered by the first
    assert len(fsyncs) == 1


def test_fail_refuses_writes_until_reopened_and_keeps_reads(open_store, config, table_of):
    store = open_store("failed", config)
    appender = Appender(store)
    appender.append(table_of(1))
    store.fail(OSError(errno.EIO, "injected"))
    with pytest.raises(DiskIOError, match="an earlier write or fsync failed"):
        store.check_usable()
    with pytest.raises(DiskIOError):
        appender.append(table_of(1))
    store.check_readable()
    assert store.view.end == 1
    reopened = open_store("failed", config)
    reopened.check_usable()
    assert Appender(reopened).append(table_of(1)).first_offset == 1


def test_write_at_tail_whose_undo_failed_fails_the_store(open_store, config):
    store = open_store("undo", config)

    def undo_failed() -> None:
        raise UndoFailedError(errno.EIO, "could not undo")

    with store.lock, pytest.raises(UndoFailedError):
        store.write_at_tail(0, 1, undo_failed)
    assert store.failure is not None and store.last_timestamp == -1


@pytest.mark.parametrize(("error", "raised"), [
    (OSError(errno.ENOSPC, "full"), DiskFullError),
    (OSError(errno.EIO, "bad block"), DiskIOError),
    (FileNotFoundError(errno.ENOENT, "staged file gone"), FileNotFoundError),
])
def test_disk_errors_name_the_stream_and_the_action(open_store, config, error, raised):
    store = open_store("errors", config)
    with pytest.raises(raised) as caught, store.disk_errors("append"):
        raise error
    if raised is not FileNotFoundError:
        assert "errors" in str(caught.value) and "append" in str(caught.value)
    assert store.failure is None  # undone: the store still takes writes


def test_close_records_the_tail_and_refuses_use(open_store, config, table_of, clock):
    store = open_store("closing", config)
    Appender(store).append(table_of(3))
    tail = store.files.tail
    store.close()
    assert read_clean_shutdown(store.directory) == CleanShutdown(0, tail.size, 3, clock.now)
    with pytest.raises(ShuttingDownError):
        store.check_usable()
    dropped = open_store("dropped", config)
    dropped.close(dropped=True)
    with pytest.raises(StreamNotFoundError):
        dropped.check_readable()

"""The registry's per-stream lifecycle (broker/streams/registry.py, records.StreamState).

In one process over a real metadata database and storage: each transition
a user's calls cause (create, first publish into the nursery, first open,
corruption and repair, delete, a restart, a stream moved in) leaves the
stream in the state that decides what the next call sees.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from npstream.broker.errors import (
    CorruptRecordError,
    StreamNeedsRepairError,
    StreamNotFoundError,
)
from npstream.broker.metadata import Metadata
from npstream.broker.server.config import default_config
from npstream.broker.storage import Storage
from npstream.broker.storage.files import stream_dir
from npstream.broker.storage.small_append import MessageRows
from npstream.broker.streams.records import StreamState
from npstream.broker.streams.registry import StreamRegistry


class _Broker:
    """A registry over its own metadata and storage (max_open_logs 1: the nursery is used)."""

    def __init__(self, data_dir: Path) -> None:
        self.config = default_config().with_values(data_dir=data_dir, max_open_logs=1)
        data_dir.mkdir(exist_ok=True)
        self.metadata = Metadata(data_dir)
        self.storage = Storage(self.config.storage)
        self.registry = StreamRegistry(self.metadata, self.storage, self.config.streams,
                                       self.config.server.max_message_bytes_limit)

    def close(self) -> None:
        self.storage.close()
        self.metadata.close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[_Broker]:
    opened = _Broker(tmp_path / "data")
    yield opened
    opened.close()


def _one_message(value: bytes) -> MessageRows:
    return MessageRows([value], [""], [None], [None])


def _fill_lru(broker: _Broker) -> None:
    """Open one log: the LRU of 1 is full, so a first publish goes to the nursery."""
    broker.registry.create("warm", {})
    broker.registry.get("warm")


def _hold_nursery_writes(broker: _Broker, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The nursery writer waits for the returned event before its transaction."""
    release = threading.Event()
    insert = broker.registry._rows.insert

    def held(rows):
        release.wait(10)
        insert(rows)

    monkeypatch.setattr(broker.registry._rows, "insert", held)
    return release


def test_create_makes_stream_ready_without_opening_its_log(broker: _Broker) -> None:
    _status, created = broker.registry.create("orders", {})

    assert created and broker.registry.state_of("orders") is StreamState.READY
    assert "orders" in broker.registry and len(broker.registry) == 1
    assert broker.registry.open_logs() == []


def test_first_publish_is_creating_until_committed_then_nursery(
        broker: _Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    _fill_lru(broker)
    release = _hold_nursery_writes(broker, monkeypatch)

    _timestamp, wait = broker.registry.create_by_first_publish("chat-1", _one_message(b"hi"))

    assert broker.registry.state_of("chat-1") is StreamState.CREATING
    assert "chat-1" not in broker.registry and len(broker.registry) == 1
    with pytest.raises(StreamNotFoundError):
        broker.registry.describe("chat-1")
    assert broker.registry.create_by_first_publish("chat-1", _one_message(b"again")) is None
    release.set()
    wait()
    assert broker.registry.state_of("chat-1") is StreamState.NURSERY
    assert "chat-1" in broker.registry and len(broker.registry) == 2
    assert not stream_dir(broker.config.server.data_dir, "chat-1").exists()
    assert broker.registry.describe("chat-1").stats.end_offset == 1


def test_get_while_creating_waits_for_the_row_then_opens(
        broker: _Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    _fill_lru(broker)
    release = _hold_nursery_writes(broker, monkeypatch)
    _timestamp, wait = broker.registry.create_by_first_publish("chat-1", _one_message(b"hi"))
    opened: list[int] = []
    getter = threading.Thread(target=lambda: opened.append(
        broker.registry.get("chat-1", create_if_missing=True).end_offset))
    getter.start()

    release.set()
    wait()
    getter.join(10)

    assert opened == [1]  # the nursery's message, written out at the open
    assert broker.registry.state_of("chat-1") is StreamState.READY
    assert stream_dir(broker.config.server.data_dir, "chat-1").is_dir()


def test_failed_first_publish_leaves_no_stream_and_name_free(
        broker: _Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    _fill_lru(broker)

    def fail(rows):
        raise OSError("disk gone")

    monkeypatch.setattr(broker.registry._rows, "insert", fail)
    _timestamp, wait = broker.registry.create_by_first_publish("chat-1", _one_message(b"hi"))

    with pytest.raises(OSError, match="disk gone"):
        wait()
    assert broker.registry.state_of("chat-1") is None and len(broker.registry) == 1
    monkeypatch.undo()
    assert broker.registry.create("chat-1", {})[1]


def test_corrupt_log_is_broken_until_repaired(broker: _Broker) -> None:
    broker.registry.create("orders", {})
    broker.registry.get("orders")
    error = CorruptRecordError("00000000000000000000.log", 0, "crc mismatch")

    broker.registry.mark_broken("orders", error)

    assert broker.registry.state_of("orders") is StreamState.BROKEN
    with pytest.raises(StreamNeedsRepairError, match="crc mismatch"):
        broker.registry.get("orders")
    assert "crc mismatch" in broker.registry.describe("orders").error
    assert broker.registry.open_logs() == []
    broker.registry.repair("orders")
    assert broker.registry.state_of("orders") is StreamState.READY
    assert broker.registry.get("orders").end_offset == 0


def test_delete_removes_record_rows_and_files(broker: _Broker) -> None:
    broker.registry.create("orders", {})
    broker.registry.get("orders")

    assert broker.registry.delete("orders")

    assert broker.registry.state_of("orders") is None and "orders" not in broker.registry
    assert not stream_dir(broker.config.server.data_dir, "orders").exists()
    assert broker.metadata.execute_tuples("SELECT name FROM streams WHERE name = 'orders'") == []
    assert not broker.registry.delete("orders")


def test_delete_that_fails_leaves_the_stream_ready(
        broker: _Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    broker.registry.create("orders", {})

    def fail(name: str) -> None:
        raise OSError("read-only file system")

    monkeypatch.setattr(broker.storage, "drop_log", fail)
    with pytest.raises(OSError, match="read-only"):
        broker.registry.delete("orders")

    assert broker.registry.state_of("orders") is StreamState.READY
    assert broker.registry.get("orders").end_offset == 0


def test_restart_finds_nursery_streams_as_nursery(tmp_path: Path) -> None:
    broker = _Broker(tmp_path / "data")
    _fill_lru(broker)
    _timestamp, wait = broker.registry.create_by_first_publish("chat-1", _one_message(b"hi"))
    wait()
    broker.close()

    again = _Broker(tmp_path / "data")
    try:
        assert again.registry.state_of("chat-1") is StreamState.NURSERY
        assert again.registry.state_of("warm") is StreamState.READY
        assert again.registry.get("chat-1").end_offset == 1
        assert again.registry.state_of("chat-1") is StreamState.READY
    finally:
        again.close()


def test_load_row_takes_up_a_stream_whose_rows_another_module_wrote(broker: _Broker) -> None:
    with broker.metadata.transaction() as txn:
        txn.execute("INSERT INTO streams (name, config_json, created_ms) VALUES "
                    "('moved', '{\"max_age_ms\": 5000}', 1)")

    assert "moved" not in broker.registry
    broker.registry.load_row("moved")

    assert broker.registry.state_of("moved") is StreamState.READY
    assert broker.registry.describe("moved").config.max_age_ms == 5000


def test_delete_that_fails_keeps_a_nursery_stream_and_its_message(
        broker: _Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    _fill_lru(broker)
    _timestamp, wait = broker.registry.create_by_first_publish("chat-1", _one_message(b"hi"))
    wait()

    def fail(name: str) -> None:
        raise OSError("read-only file system")

    monkeypatch.setattr(broker.storage, "drop_log", fail)
    with pytest.raises(OSError, match="read-only"):
        broker.registry.delete("chat-1")
    monkeypatch.undo()

    assert broker.registry.state_of("chat-1") is StreamState.NURSERY
    assert broker.registry.get("chat-1").read_table(0, 1).column("value").to_pylist() == [b"hi"]

"""Unit tests of group rows and the batching position writer on a real SQLite Metadata."""

from __future__ import annotations

import threading

import pytest

from npstream.broker.groups.shared_config import SharedConfig
from npstream.broker.groups.store import GroupStore, PositionWriter
from npstream.broker.metadata import Metadata
from npstream.proto import pb


@pytest.fixture
def store(tmp_path):
    metadata = Metadata(tmp_path)
    yield GroupStore(metadata, clock=lambda: 1234)
    metadata.close()


def test_create_returns_existing_row_unchanged(store):
    row, created = store.create("s", "g", "cursor", 5)
    assert created and (row.kind, row.committed_offset, row.created_ms) == ("cursor", 5, 1234)
    again, created = store.create("s", "g", "shared", 9)
    assert not created and again == row


def test_shared_config_round_trips_through_the_row(store):
    config = SharedConfig(ack_wait_ms=500, max_deliver=3, backoff_ms=(10, 20),
                          dead_letter_stream="s.dlq")
    store.create("s", "g", "shared", 0, config)
    assert store.get("s", "g").config == config
    assert store.get("s", "missing") is None


def test_writer_coalesces_many_puts_into_few_transactions(store, monkeypatch):
    store.create("s", "g", "shared", 0)
    writes: list[dict] = []
    original = store.write_positions

    def counting(updates):
        writes.append(dict(updates))
        original(updates)

    monkeypatch.setattr(store, "write_positions", counting)
    writer = PositionWriter(store, interval_s=0.05)
    tickets = [writer.put("s", "g", offset, 0) for offset in range(1, 1001)]
    assert writer.wait(tickets[-1], timeout=10)
    writer.close()
    assert store.get("s", "g").committed_offset == 1000
    assert len(writes) <= 3  # 1000 acks, a handful of SQLite commits


def test_writer_wait_returns_once_written_by_concurrent_putters(store):
    for g in ("a", "b", "c"):
        store.create("s", g, "shared", 0)
    writer = PositionWriter(store)
    done: list[bool] = []

    def putter(group: str) -> None:
        for offset in range(1, 51):
            ticket = writer.put("s", group, offset, 1)
        done.append(writer.wait(ticket, timeout=10))

    threads = [threading.Thread(target=putter, args=(g,)) for g in ("a", "b", "c")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    assert done == [True, True, True]
    assert [(r.group, r.committed_offset, r.dead_lettered) for r in store.list("s")] == [
        ("a", 50, 1), ("b", 50, 1), ("c", 50, 1)]


def test_discarded_updates_never_resurrect_a_deleted_group(store):
    store.create("s", "g", "cursor", 0)
    writer = PositionWriter(store, interval_s=0.2)
    writer.put("s", "g", 7, 0)
    writer.discard("s", "g")
    writer.flush()
    assert store.delete("s", "g") is True
    writer.put("s", "g", 9, 0)  # a late update from a closed group object
    writer.close()
    assert store.get("s", "g") is None
    assert store.delete("s", "g") is False


def test_delete_stream_drops_only_that_streams_groups(store):
    store.create("s", "a", "cursor", 0)
    store.create("s", "b", "", 0)
    store.create("t", "a", "cursor", 0)
    assert store.delete_stream("s") == 2
    assert store.streams() == ["t"]


def test_shared_config_from_pb_checks_values_and_fills_defaults():
    config = SharedConfig.from_pb("orders", pb.SharedGroupConfig())
    assert config == SharedConfig(ack_wait_ms=30_000, max_deliver=0, backoff_ms=(),
                                  dead_letter_stream="orders.dlq", ordering="")
    assert config.resolved(None).ordering == "none"  # unspecified: unordered when new...
    keyed = SharedConfig(dead_letter_stream="orders.dlq", ordering="key")
    assert config.resolved(keyed).ordering == "key"  # ...and what the group has otherwise
    assert SharedConfig.from_json(keyed.to_json()) == keyed
    explicit = SharedConfig.from_pb("orders", pb.SharedGroupConfig(ordering=pb.ORDERING_NONE))
    assert explicit.resolved(keyed).ordering == "none"
    assert [config.backoff_after(a) for a in (1, 2)] == [0, 0]
    backoff = SharedConfig.from_pb("o", pb.SharedGroupConfig(backoff_ms=[100, 500]))
    assert [backoff.backoff_after(a) for a in (1, 2, 3, 9)] == [100, 500, 500, 500]
    from npstream.broker.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="max_deliver=-2 for stream 'o'"):
        SharedConfig.from_pb("o", pb.SharedGroupConfig(max_deliver=-2))
    with pytest.raises(InvalidArgumentError, match=r"invalid stream name '\.\./x'"):
        SharedConfig.from_pb("o", pb.SharedGroupConfig(dead_letter_stream="../x"))

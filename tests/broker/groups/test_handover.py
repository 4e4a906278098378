"""The groups' handover records (broker/groups/handover.py), on real SQLite files."""

from __future__ import annotations

from pathlib import Path

from npstream.broker.groups.handover import GroupsOwner
from npstream.broker.groups.shared_config import SharedConfig
from npstream.broker.groups.store import GroupStore
from npstream.broker.handover import install_stream
from npstream.broker.metadata import Metadata

_DLQ = SharedConfig(ack_wait_ms=500, max_deliver=3, backoff_ms=(10, 20),
                    dead_letter_stream="orders.dlq")


def _member(data_dir: Path) -> tuple[Metadata, GroupStore, GroupsOwner]:
    data_dir.mkdir()
    metadata = Metadata(data_dir)
    return metadata, GroupStore(metadata, clock=lambda: 1234), GroupsOwner(metadata)


def _groups(store: GroupStore) -> None:
    store.create("orders", "billing", "cursor", 5)
    store.create("orders", "workers", "shared", 2, _DLQ)
    store.create("orders", "positioned", "", 0)
    store.write_positions({("orders", "billing"): (40, 0), ("orders", "workers"): (17, 3)})
    store.create("other", "billing", "cursor", 9)


def test_export_then_install_into_fresh_metadata_reads_back_equal(tmp_path: Path) -> None:
    _, source, owner = _member(tmp_path / "a")
    target_metadata, target, target_owner = _member(tmp_path / "b")
    _groups(source)

    with target_metadata.transaction() as txn:
        install_stream([target_owner], "orders", owner.export("orders"), txn)

    assert target.list("orders") == source.list("orders")
    assert [(g.group, g.committed_offset, g.dead_lettered) for g in target.list("orders")] == [
        ("billing", 40, 0), ("positioned", 0, 0), ("workers", 17, 3)]
    assert target.get("orders", "workers").config == _DLQ
    assert target.list("other") == []


def test_drop_removes_every_group_of_the_stream_only(tmp_path: Path) -> None:
    metadata, store, owner = _member(tmp_path / "a")
    _groups(store)

    with metadata.transaction() as txn:
        owner.drop("orders", txn)

    assert store.list("orders") == [] and owner.export("orders") == []
    assert [g.group for g in store.list("other")] == ["billing"]


def test_dead_letter_streams_only_those_no_other_stream_uses(tmp_path: Path) -> None:
    _, store, owner = _member(tmp_path / "a")
    _groups(store)
    audit = SharedConfig(ack_wait_ms=500, max_deliver=3, backoff_ms=(),
                         dead_letter_stream="audit.dlq")
    store.create("orders", "audit", "shared", 0, audit)
    store.create("payments", "audit", "shared", 0, audit)

    assert owner.dead_letter_streams("orders") == ["orders.dlq"]
    assert owner.dead_letter_streams("payments") == []

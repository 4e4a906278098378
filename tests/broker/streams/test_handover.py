"""The streams package's handover records (broker/streams/handover.py), on real SQLite files.

A stream's rows exported from one metadata database and installed into a
fresh one read back equal there; dropping them leaves nothing of the stream
and everything of the others.
"""

from __future__ import annotations

import json
from pathlib import Path

from npstream.broker.handover import export_stream, install_stream
from npstream.broker.metadata import Metadata
from npstream.broker.storage import LogStats
from npstream.broker.streams.handover import ListingStatsOwner, StreamRowsOwner
from npstream.broker.streams.listing_stats import ListingStats
from npstream.broker.streams.nursery import Nursery
from npstream.broker.streams.records import NewRow, StreamRecord
from npstream.broker.streams.rows import StreamRows
from npstream.broker.streams.schemas import StreamSchemas

# (table, its stream column)
_TABLES = (("streams", "name"), ("stream_schemas", "stream"), ("nursery", "stream"),
           ("stream_stats", "stream"))


class _Member:
    """The streams package's stores on one metadata database, and its two owners."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir()
        self.metadata = Metadata(data_dir)
        self.schemas = StreamSchemas(self.metadata, lambda: 1_700_000_000_000)
        self.rows = StreamRows(self.metadata, self.schemas)
        self.nursery = Nursery(self.metadata)
        self.stats = ListingStats(self.metadata)
        self.owners = [StreamRowsOwner(self.metadata), ListingStatsOwner(self.stats)]

    def rows_of(self, stream: str) -> dict[str, list[tuple[object, ...]]]:
        self.stats.flush()  # the buffered stats rows too
        return {table: self.metadata.execute_tuples(
            f"SELECT * FROM {table} WHERE {column} = ? ORDER BY 1, 2", (stream,))
            for table, column in _TABLES}


def _typed_stream(member: _Member, name: str) -> None:
    """A typed stream with two schema versions and a config override, its stats kept."""
    first = member.schemas.new_version(name, "sensorId STRING NOT NULL, reading DOUBLE", 1)
    member.rows.insert([NewRow(StreamRecord(name, {"max_age_ms": 60_000}, 1_600_000_000_000,
                                            (first,)), json.dumps({"max_age_ms": 60_000}), first)])
    second = member.schemas.evolve(name, (first,), "sensorId STRING NOT NULL, reading DOUBLE, "
                                   "unit STRING")
    assert second is not None
    member.schemas.insert(name, second)
    member.stats.put(name, LogStats(3, 10, 4096, 1_600_000_000_100, 1_600_000_000_900, 2))


def _nursery_stream(member: _Member, name: str) -> None:
    member.rows.insert([NewRow(StreamRecord(name, {}, 1_650_000_000_000), "{}", None)])
    member.nursery.insert([(name, b"\x01frame bytes\xff", 1, 1_650_000_000_001)])


def test_export_then_install_into_fresh_metadata_reads_back_equal(tmp_path: Path) -> None:
    source, target = _Member(tmp_path / "a"), _Member(tmp_path / "b")
    _typed_stream(source, "sensors")
    _nursery_stream(source, "chat-1")
    # The end offset the registry recorded travels too (end_floors.py): offsets below it
    # were handed out and must not be again on the target.
    source.metadata.execute("UPDATE streams SET end_floor = 42 WHERE name = 'sensors'")

    for name in ("sensors", "chat-1"):
        records = export_stream(source.owners, name)
        with target.metadata.transaction() as txn:
            install_stream(target.owners, name, records, txn)

    for name in ("sensors", "chat-1"):
        assert target.rows_of(name) == source.rows_of(name)
        assert target.rows.load(name) == source.rows.load(name)
    assert target.rows_of("sensors")["stream_stats"] == [
        ("sensors", 3, 10, 4096, 1_600_000_000_100, 1_600_000_000_900, 2)]
    assert [v.version for v in target.schemas.load("sensors")] == [1, 2]
    assert target.metadata.execute_tuples(
        "SELECT end_floor FROM streams WHERE name = 'sensors'") == [(42,)]
    assert target.nursery.frame_of("chat-1") == b"\x01frame bytes\xff"


def test_export_records_are_plain_json_values_with_kind_and_version(tmp_path: Path) -> None:
    source = _Member(tmp_path / "a")
    _typed_stream(source, "sensors")

    records = export_stream(source.owners, "sensors")

    assert [(r.kind, r.version) for r in records] == [
        ("stream.config", 1), ("stream.schema", 1), ("stream.schema", 1), ("stream.stats", 1)]
    assert records[0].body == {"overrides": {"max_age_ms": 60_000},
                               "created_ms": 1_600_000_000_000, "end_floor": 0}
    assert json.loads(json.dumps([r.to_json() for r in records])) == [r.to_json() for r in records]


def test_export_of_unknown_stream_is_empty(tmp_path: Path) -> None:
    assert export_stream(_Member(tmp_path / "a").owners, "nope") == []


def test_drop_removes_every_row_of_the_stream_only(tmp_path: Path) -> None:
    member = _Member(tmp_path / "a")
    _typed_stream(member, "sensors")
    _typed_stream(member, "sensors-2")
    _nursery_stream(member, "chat-1")
    kept = member.rows_of("sensors-2")

    with member.metadata.transaction() as txn:
        for owner in member.owners:
            owner.drop("sensors", txn)
            owner.drop("chat-1", txn)

    for name in ("sensors", "chat-1"):
        assert member.rows_of(name) == {table: [] for table, _ in _TABLES}
        assert member.stats.get(name) is None
    assert member.rows_of("sensors-2") == kept

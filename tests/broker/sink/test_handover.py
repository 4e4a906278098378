"""The sink's handover records (broker/sink/handover.py), on real SQLite files."""

from __future__ import annotations

from pathlib import Path

from npstream.broker.handover import install_stream
from npstream.broker.metadata import Metadata
from npstream.broker.sink.handover import SinkFloorsOwner
from npstream.broker.sink.markers import SinkMarkers


def _member(data_dir: Path) -> tuple[Metadata, SinkMarkers, SinkFloorsOwner]:
    data_dir.mkdir()
    metadata = Metadata(data_dir)
    return metadata, SinkMarkers(metadata, clock=lambda: 1234), SinkFloorsOwner(metadata)


def _commit(markers: SinkMarkers, sink_id: str, batch_id: int, streams: list[str]) -> None:
    pending = markers.begin(sink_id, batch_id, ["st-1"], streams)
    for stream in streams:
        markers.record(pending, stream, 0, 1, "committing")
        markers.mark_done(pending, stream)
    markers.finish(pending)


def test_export_then_install_gives_the_stream_its_floors(tmp_path: Path) -> None:
    source_metadata, source, owner = _member(tmp_path / "a")
    target_metadata, target, target_owner = _member(tmp_path / "b")
    _commit(source, "etl", 7, ["orders"])
    _commit(source, "audit", 3, ["payments"])
    with source_metadata.transaction() as txn:  # the stream moved here before, from batch 9
        txn.execute("INSERT INTO sink_floors VALUES ('etl', 'orders', 9)")

    with target_metadata.transaction() as txn:
        install_stream([target_owner], "orders", owner.export("orders"), txn)

    # every committed batch is in the log that travels; a floor it brought stays
    assert (target.floor("etl", "orders"), target.floor("audit", "orders")) == (9, 3)
    assert target_owner.export("orders") == owner.export("orders")
    assert target.floor("etl", "payments") is None


def test_drop_removes_the_streams_floors_and_markers_only(tmp_path: Path) -> None:
    metadata, markers, owner = _member(tmp_path / "a")
    pending = markers.begin("etl", 1, ["st-1"], ["orders", "payments"])
    markers.record(pending, "orders", 0, 5, "committing")
    markers.record(pending, "payments", 0, 5, "committing")
    with metadata.transaction() as txn:
        txn.execute("INSERT INTO sink_floors VALUES ('etl', 'orders', 0), ('etl', 'payments', 0)")

    with metadata.transaction() as txn:
        owner.drop("orders", txn)

    assert markers.marker(pending, "orders") is None and markers.floor("etl", "orders") is None
    assert markers.marker(pending, "payments") is not None
    assert markers.floor("etl", "payments") == 0


def test_pending_into_names_the_sinks_committing_into_the_stream(tmp_path: Path) -> None:
    _, markers, owner = _member(tmp_path / "a")
    markers.begin("etl", 1, ["st-1"], ["orders", "payments"])
    markers.begin("audit", 4, ["st-2"], ["payments"])

    assert owner.pending_into("orders") == ["etl"]
    assert owner.pending_into("payments") == ["audit", "etl"]
    assert owner.committed_batches() == {}

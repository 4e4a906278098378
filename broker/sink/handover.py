"""The sink's per-stream state as handover records (npstream.broker.handover).

Kind ``sink.floor``, version 1, one per sink: the last batch of that sink
whose rows for the stream are in the stream already (markers.py
``sink_floors``). Exported as the higher of the sink's last committed batch
here (every committed batch's rows are in the log that travels) and the
floor the stream brought when it moved here before; installed as the
stream's floors on the other member, so a batch replayed there appends
nothing twice.

Markers of a commit in progress do not travel: a stream is handed over only
while no commit into it is pending or staged (``pending_into``,
``staged_batches``; the move checks both, cluster/move.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from npstream.broker.handover import StateRecord, check_version
from npstream.broker.metadata import Metadata
from npstream.broker.sink.markers import SinkMarkers
from npstream.broker.sink.staging import uncommitted_batches

__all__ = ["SinkFloorsOwner"]

FLOOR = "sink.floor"
_VERSION = 1


class SinkFloorsOwner:
    """The sink floors of a stream, and what a handover must wait for."""

    kinds = (FLOOR,)

    def __init__(self, metadata: Metadata) -> None:
        SinkMarkers(metadata)  # its tables
        self._metadata = metadata

    def export(self, stream: str, /) -> list[StateRecord]:
        floors = self.committed_batches()
        for sink_id, batch_id in self._metadata.execute_tuples(
                "SELECT sink_id, last_batch_id FROM sink_floors WHERE stream = ?", (stream,)):
            floors[str(sink_id)] = max(floors.get(str(sink_id), -1), int(batch_id))
        return [StateRecord(FLOOR, _VERSION, {"sink_id": sink_id, "last_batch_id": batch_id})
                for sink_id, batch_id in sorted(floors.items())]

    def install(self, stream: str, records: Sequence[StateRecord], txn: Metadata, /) -> None:
        for record in records:
            check_version(record, _VERSION)
            txn.execute("INSERT INTO sink_floors (sink_id, stream, last_batch_id) "
                        "VALUES (?, ?, ?)",
                        (str(record.body["sink_id"]), stream, int(record.body["last_batch_id"])))

    def drop(self, stream: str, txn: Metadata, /) -> None:
        txn.execute("DELETE FROM sink_markers WHERE stream = ?", (stream,))
        txn.execute("DELETE FROM sink_floors WHERE stream = ?", (stream,))

    def committed_batches(self) -> dict[str, int]:
        """Every sink's last committed batch id."""
        return {str(sink_id): int(batch_id) for sink_id, batch_id in self._metadata.execute_tuples(
            "SELECT sink_id, last_batch_id FROM sink_state")}

    def pending_into(self, stream: str) -> list[str]:
        """The sinks whose unfinished commit appends to ``stream``."""
        return [str(sink_id) for sink_id, streams in self._metadata.execute_tuples(
            "SELECT sink_id, streams FROM sink_pending ORDER BY sink_id")
            if stream in json.loads(streams)]

    def staged_batches(self, staging_root: Path, stream: str) -> list[tuple[str, int]]:
        """(sink, batch) of uncommitted batches with rows staged into ``stream`` here."""
        return uncommitted_batches(staging_root, stream, self.committed_batches())

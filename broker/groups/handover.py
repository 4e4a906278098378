"""The groups of a stream as handover records (npstream.broker.handover).

Kind ``group``, version 1, one per group row (store.py): name, kind (cursor,
shared or positioned only), committed offset, dead-lettered count, a shared
group's settings (SharedConfig JSON, "" otherwise) and its times. Leases are
not state that travels: as over a restart, unacked messages are delivered
again. Export reads the rows, so the caller has the group positions written
first (a move pauses the stream: GroupManager.release_stream).
"""

from __future__ import annotations

from collections.abc import Sequence

from npstream.broker.groups.shared_config import SharedConfig
from npstream.broker.groups.store import GroupStore
from npstream.broker.handover import StateRecord, check_version
from npstream.broker.metadata import Metadata

__all__ = ["GroupsOwner"]

GROUP = "group"
_VERSION = 1
_FIELDS = ("grp", "kind", "committed_offset", "dead_lettered", "config_json", "created_ms",
           "updated_ms")
_COLUMNS = ", ".join(_FIELDS)


class GroupsOwner:
    """The ``consumer_groups`` rows of a stream."""

    kinds = (GROUP,)

    def __init__(self, metadata: Metadata) -> None:
        GroupStore(metadata)  # its table
        self._metadata = metadata

    def export(self, stream: str, /) -> list[StateRecord]:
        return [StateRecord(GROUP, _VERSION, {
            "group": str(grp), "kind": str(kind), "committed_offset": int(committed),
            "dead_lettered": int(dead), "config_json": str(config), "created_ms": int(created),
            "updated_ms": int(updated)})
            for grp, kind, committed, dead, config, created, updated
            in self._metadata.execute_tuples(
                f"SELECT {_COLUMNS} FROM consumer_groups WHERE stream = ? ORDER BY grp",
                (stream,))]

    def install(self, stream: str, records: Sequence[StateRecord], txn: Metadata, /) -> None:
        for record in records:
            check_version(record, _VERSION)
            body = record.body
            txn.execute(
                f"INSERT INTO consumer_groups (stream, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (stream, str(body["group"]), str(body["kind"]), int(body["committed_offset"]),
                 int(body["dead_lettered"]), str(body["config_json"]), int(body["created_ms"]),
                 int(body["updated_ms"])))

    def drop(self, stream: str, txn: Metadata, /) -> None:
        txn.execute("DELETE FROM consumer_groups WHERE stream = ?", (stream,))

    def dead_letter_streams(self, stream: str) -> list[str]:
        """The dead-letter streams of ``stream``'s shared groups no other stream's group uses.

        A dead-letter stream lives with its group's stream (docs/groups.md), so
        these go where ``stream`` goes.
        """
        used_by: dict[str, set[str]] = {}
        for user, config_json in self._metadata.execute_tuples(
                "SELECT stream, config_json FROM consumer_groups WHERE kind = 'shared'"):
            try:
                config = SharedConfig.from_json(config_json)
            except (ValueError, KeyError, TypeError):
                continue
            if config is not None and config.dead_letter_stream:
                used_by.setdefault(config.dead_letter_stream, set()).add(str(user))
        return sorted(name for name, users in used_by.items()
                      if users == {stream} and name != stream)

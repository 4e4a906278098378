"""Per-stream state handed from one member to another: records, and the owners that make them.

A stream is more than its log files: its config and schema versions, its
groups' positions, the sink floors, the listing stats are rows of the
metadata SQLite, each table owned by one package. Whoever carries a stream
elsewhere (a move today, cluster/move.py; replication next, shipping the
same records in log order) asks every owner for the stream's records and
hands them to the other member's owners, instead of reading the tables by
name: a package changes its tables, and its records with them, in one place.

A record is a plain value: a ``kind`` naming its owner's table ("group",
"stream.schema", ...), a ``version`` of that kind's body, and a body of JSON
values (bytes as base64, ``encode_bytes``). An owner installs only the
versions it knows and refuses newer ones (``check_version``), so a member
never drops fields it cannot read. Each owner implements ``StreamStateOwner``;
``export_stream``/``install_stream`` run over a list of them.

This module sits below the domain packages and the cluster: both import it,
it imports neither.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from npstream.broker.errors import InvalidArgumentError
from npstream.broker.metadata import Metadata

__all__ = ["StateRecord", "StreamStateOwner", "check_kinds", "check_version", "decode_bytes",
           "decode_records", "encode_bytes", "encode_records", "export_stream", "install_stream"]


@dataclass(frozen=True)
class StateRecord:
    """One piece of a stream's state, as its owner exports it (module doc)."""

    kind: str
    version: int
    body: Mapping[str, Any]  # JSON values only

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": self.version, "body": dict(self.body)}

    @classmethod
    def from_json(cls, value: object) -> StateRecord:
        """The record of ``to_json``'s value; InvalidArgumentError naming what is wrong."""
        if not isinstance(value, dict):
            raise InvalidArgumentError(f"a stream state record is a JSON object, not {value!r:.60}")
        kind, version, body = value.get("kind"), value.get("version"), value.get("body")
        if not isinstance(kind, str) or not kind:
            raise InvalidArgumentError(f"stream state record without a kind: {value!r:.80}")
        if not isinstance(version, int) or version < 1:
            raise InvalidArgumentError(f"stream state record '{kind}' has version {version!r}; "
                                       "versions are integers from 1")
        if not isinstance(body, dict):
            raise InvalidArgumentError(f"stream state record '{kind}' has no body object")
        return cls(kind, version, body)


class StreamStateOwner(Protocol):
    """A package keeping state per stream: it exports, installs and drops that state.

    ``kinds``: the record kinds it makes and takes. ``export`` reads what is
    durable, so the caller quiesces the stream first (a move pauses it and its
    groups write their positions). ``install`` and ``drop`` run inside the
    caller's transaction (``txn``, a ``Metadata`` in ``transaction()``), so a
    stream arrives, or goes, with all of its state at once or not at all.
    """

    @property
    def kinds(self) -> tuple[str, ...]: ...

    def export(self, stream: str, /) -> list[StateRecord]: ...

    def install(self, stream: str, records: Sequence[StateRecord], txn: Metadata, /) -> None: ...

    def drop(self, stream: str, txn: Metadata, /) -> None: ...


def check_version(record: StateRecord, known: int) -> None:
    """InvalidArgumentError when ``record`` is newer than the ``known`` version of its kind."""
    if record.version > known:
        raise InvalidArgumentError(
            f"stream state record '{record.kind}' version {record.version} is newer than this "
            f"broker reads (up to {known}); upgrade this member first")


def encode_bytes(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decode_bytes(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def encode_records(records: Iterable[StateRecord]) -> list[dict[str, Any]]:
    """The records as JSON values (``json.dumps`` takes them as they are)."""
    return [record.to_json() for record in records]


def decode_records(values: object) -> list[StateRecord]:
    if not isinstance(values, list):
        raise InvalidArgumentError("a stream's state records are a JSON list")
    return [StateRecord.from_json(value) for value in values]


def export_stream(owners: Sequence[StreamStateOwner], stream: str) -> list[StateRecord]:
    """Every owner's records of ``stream``, owner by owner."""
    return [record for owner in owners for record in owner.export(stream)]


def check_kinds(owners: Sequence[StreamStateOwner], stream: str,
                records: Sequence[StateRecord]) -> None:
    """InvalidArgumentError when a record is of a kind no owner takes (it would be lost)."""
    kinds = {kind for owner in owners for kind in owner.kinds}
    unknown = sorted({record.kind for record in records} - kinds)
    if unknown:
        raise InvalidArgumentError(
            f"stream '{stream}': state record kind(s) {', '.join(unknown)} are unknown to this "
            f"broker (it takes {', '.join(sorted(kinds))}); upgrade this member first")


def install_stream(owners: Sequence[StreamStateOwner], stream: str,
                   records: Sequence[StateRecord], txn: Metadata) -> None:
    """Replace ``stream``'s state by ``records`` inside the caller's transaction.

    Every owner drops what it holds of the stream (a crashed earlier attempt)
    and installs its records. A record no owner takes is refused before
    anything is written (``check_kinds``).
    """
    check_kinds(owners, stream, records)
    for owner in owners:
        owner.drop(stream, txn)
        owner.install(stream, [r for r in records if r.kind in owner.kinds], txn)


"""Values the storage engine returns to the broker (see docs/internals.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["AppendResult", "LogStats", "ReadResult", "StoredRow"]


class StoredRow(NamedTuple):
    """One stored message as Python values (the columns of MESSAGE_SCHEMA); read-only.

    ``headers`` is ``{}`` when the message has none. Shared groups hand these
    out as they are (groups.leases.DeliveryRow is this type).
    """

    offset: int
    id: str
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    timestamp_ms: int


@dataclass(frozen=True)
class AppendResult:
    """Outcome of one append.

    ``first_offset`` is the offset of the first stored message; when every
    message was a duplicate nothing is stored and it is the end offset at the
    time of the append (the offset the next message will get).
    """

    first_offset: int
    stored_count: int
    duplicates: list[tuple[int, int]]  # (index in input, original offset)
    timestamp_ms: int
    # The log's write sequence once this append was written: StreamLog.sync_through of it
    # returns when the append is durable (a pipelined publish acks FSYNC after that).
    write_sequence: int = 0


@dataclass(frozen=True)
class ReadResult:
    """Stored Arrow IPC record-batch messages covering [offset, next_offset).

    Untyped streams: every batch in MESSAGE_SCHEMA and ``versions`` empty. Typed
    streams: ``versions[i]`` is the value schema version batch ``i`` is
    encoded in (its stored schema); ``StreamLog.read(..., latest=True)``
    returns them all in ``schema_version``, the stream's current version.
    """

    batches: list[bytes | memoryview]
    next_offset: int
    count: int
    versions: tuple[int, ...] = ()
    schema_version: int = 0


@dataclass(frozen=True)
class LogStats:
    start_offset: int
    end_offset: int
    bytes_on_disk: int
    first_timestamp_ms: int  # 0 when empty
    last_timestamp_ms: int  # 0 when empty
    segment_count: int

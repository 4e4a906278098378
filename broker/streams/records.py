"""What the registry keeps per stream, and what it reports: records, statuses, schema versions.

Plain values apart from the registry's behaviour (registry.py), so the
services, the console and the cluster can name them without the registry.

A stream's lifecycle is its record's ``state`` (``StreamState``)::

    CREATING --row committed--> READY <--first open, written out-- NURSERY
    CREATING --first publish: row and first frame committed--> NURSERY
    CREATING --transaction failed--> (no record)
    READY --corrupt log--> BROKEN --repair--> READY
    READY, NURSERY, BROKEN --delete--> DELETING --> (no record)

A record is immutable; a transition puts a new one in the registry's map.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyarrow as pa

from npstream.broker.storage import UNTYPED, LogStats, StreamConfig, ValueSchemas

__all__ = ["NO_EVENT", "NO_OVERRIDES", "NewRow", "SchemaVersion", "StreamRecord",
           "StreamState", "StreamStatus", "overrides_of"]

NO_OVERRIDES: Mapping[str, int] = {}  # shared by every stream that overrides nothing


@dataclass(frozen=True)
class SchemaVersion:
    """One version of a typed stream's value schema."""

    version: int
    schema: pa.Schema  # the value's fields
    ddl: str
    arrow_schema: bytes  # serialize_schema(schema), as stored and sent
    created_ms: int


@dataclass(frozen=True)
class StreamStatus:
    """What DescribeStream reports; ``stats`` is None when the log needs repair."""

    name: str
    config: StreamConfig
    created_ms: int
    stats: LogStats | None
    error: str = ""
    schemas: tuple[SchemaVersion, ...] = ()  # oldest first; empty: untyped


class StreamState(enum.Enum):
    """Where a stream is in its lifecycle (module doc)."""

    # Its row is queued for the group insert: a stream for nobody but its creators yet
    # (``detail``: the NewRow, whose ``done`` they wait on).
    CREATING = "creating"
    # Its row and first message are committed (nursery.py); no directory yet. The
    # first open writes the message out as its first segment.
    NURSERY = "nursery"
    # It has its directory; its log is open while the storage holds a live one.
    READY = "ready"
    # Its log failed to open with mid-log corruption (``detail``: the error); every
    # read and write fails with StreamNeedsRepairError until a repair.
    BROKEN = "broken"
    # Being deleted: its files and rows go, then its record.
    DELETING = "deleting"


class StreamRecord(NamedTuple):
    """What the registry keeps in memory per stream (tens of bytes with the name).

    A tuple: immutable, and built in a third of a frozen dataclass's time,
    which a million records at start and every create pay.
    """

    name: str
    overrides: Mapping[str, int]
    created_ms: int
    schemas: tuple[SchemaVersion, ...] = ()
    state: StreamState = StreamState.READY
    detail: Any = None  # what the state holds (StreamState)

    def value_schemas(self) -> ValueSchemas:
        if not self.schemas:
            return UNTYPED
        return ValueSchemas.of({v.version: v.schema for v in self.schemas})

    def moved_to(self, state: StreamState, detail: Any = None) -> StreamRecord:
        """The same stream in ``state``."""
        return StreamRecord(self.name, self.overrides, self.created_ms, self.schemas, state,
                            detail)


def overrides_of(config_json: str) -> Mapping[str, int]:
    if config_json == "{}":
        return NO_OVERRIDES
    return {k: int(v) for k, v in json.loads(config_json).items()}


@dataclass(eq=False)
class NewRow:
    """A stream row waiting for the group insert (a GroupCommit item, registry.py).

    ``record`` is the stream's record once the row is committed (READY, or
    NURSERY with a first frame); until then the registry holds a CREATING one.
    """

    record: StreamRecord
    config_json: str
    schema: SchemaVersion | None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    frame: bytes = b""  # a nursery stream's first frame (nursery.py)
    timestamp_ms: int = 0  # the frame's message timestamp


NO_EVENT = threading.Event()  # a nursery row's stand-in until its writer round's is known

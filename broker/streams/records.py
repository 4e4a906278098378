"""What the registry keeps per stream, and what it reports: records, statuses, schema versions.

Plain values apart from the registry's behaviour (registry.py), so the
services, the console and the cluster can name them without the registry.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa

from npstream.broker.storage import UNTYPED, LogStats, StreamConfig, ValueSchemas

__all__ = ["NO_EVENT", "NO_OVERRIDES", "NewRow", "SchemaVersion", "StreamRecord",
           "StreamStatus", "overrides_of"]

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


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """What the registry keeps in memory per stream (tens of bytes with the name)."""

    name: str
    overrides: Mapping[str, int]
    created_ms: int
    schemas: tuple[SchemaVersion, ...] = ()

    def value_schemas(self) -> ValueSchemas:
        if not self.schemas:
            return UNTYPED
        return ValueSchemas.of({v.version: v.schema for v in self.schemas})


def overrides_of(config_json: str) -> Mapping[str, int]:
    if config_json == "{}":
        return NO_OVERRIDES
    return {k: int(v) for k, v in json.loads(config_json).items()}


@dataclass(eq=False)
class NewRow:
    """A stream row waiting for the group insert (CommitQueue payload)."""

    record: StreamRecord
    config_json: str
    schema: SchemaVersion | None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    frame: bytes = b""  # a nursery stream's first frame (nursery.py)
    timestamp_ms: int = 0  # the frame's message timestamp


NO_EVENT = threading.Event()  # a nursery row's stand-in until its writer round's is known

"""A typed stream's value schemas as the engine uses them: one stored schema per version.

The broker's registry owns the schemas (SQLite, docs/typed-streams.md) and
hands every version to the log (``Storage.open_log(..., value_schemas=)``,
``StreamLog.set_value_schemas``); the engine keeps no schema file of its own.
A frame's header records the version its payload was written in
(``schema_version``; 0 = untyped, MESSAGE_SCHEMA), and every path that
decodes a payload takes that version's stored schema from here. Versions
only ever get added, so a snapshot taken after a read view (LogView.schemas)
knows every version of the frames in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import pyarrow as pa

from npstream.broker.errors import CorruptRecordError
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.proto.value_schema import stored_schema

__all__ = ["UNTYPED", "ValueSchemas"]


@dataclass(frozen=True)
class ValueSchemas:
    """Value schemas by version (1, 2, ...) and the stored batch schema of each; immutable.

    Empty for an untyped stream (``current`` 0): its frames are MESSAGE_SCHEMA.
    """

    values: Mapping[int, pa.Schema] = field(default_factory=lambda: MappingProxyType({}))
    stored: Mapping[int, pa.Schema] = field(default_factory=lambda: MappingProxyType({}))
    # The stored schemas as Arrow IPC schema messages (what a typed Fetch sends; not
    # value_schema.serialize_schema, which is for value schemas and normalizes them).
    stored_ipc: Mapping[int, bytes] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, values: Mapping[int, pa.Schema]) -> ValueSchemas:
        """From the value schema (the fields) of every version."""
        if any(version < 1 for version in values):
            raise ValueError(f"value schema versions start at 1, got {sorted(values)}")
        ordered = dict(sorted(values.items()))
        stored = {v: stored_schema(s) for v, s in ordered.items()}
        return cls(MappingProxyType(ordered), MappingProxyType(stored),
                   MappingProxyType({v: s.serialize().to_pybytes() for v, s in stored.items()}))

    @property
    def current(self) -> int:
        """The version appends are written in; 0 for an untyped stream."""
        return next(reversed(self.values)) if self.values else 0

    @property
    def typed(self) -> bool:
        return bool(self.values)

    @property
    def current_value_schema(self) -> pa.Schema:
        return self.values[self.current]

    def stored_schema(self, version: int, path: Path | str = "", position: int = 0
                      ) -> pa.Schema:
        """The schema a frame of ``version`` decodes with; CorruptRecordError if unknown.

        ``path`` and ``position`` name the frame in the error.
        """
        if version == 0:
            return MESSAGE_SCHEMA
        schema = self.stored.get(version)
        if schema is None:
            raise CorruptRecordError(
                path, position, f"frame written in value schema version {version}, which the "
                f"stream does not have (versions: {sorted(self.values) or 'none'})")
        return schema

    def with_version(self, version: int, value_schema: pa.Schema) -> ValueSchemas:
        """These schemas plus ``version`` (a new current version)."""
        return ValueSchemas.of({**self.values, version: value_schema})


UNTYPED = ValueSchemas()

"""The offset of the ``npstream`` Spark source: ``{stream: next_offset}``.

Each value is the *next* offset to read in that stream, so a batch planned
from ``start`` to ``end`` covers ``[start[s], end[s])`` per stream: the end is
exclusive, like Kafka's ``KafkaSourceOffset`` and the broker's ``end_offset``.
Spark keeps the JSON form in the checkpoint (``{"orders": 42, "clicks": 7}``),
so the form must stay flat and stable: stream names are keys, offsets are
non-negative integers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from npstream.errors import InvalidArgument
from npstream.proto.names import validate_stream_name

__all__ = ["SourceOffset"]


@dataclass(frozen=True)
class SourceOffset:
    """An immutable ``{stream: next_offset}`` map with a JSON round trip."""

    next_offsets: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        checked: dict[str, int] = {}
        for stream, offset in sorted(self.next_offsets.items()):
            try:
                validate_stream_name(stream)
            except ValueError as exc:
                raise InvalidArgument(str(exc)) from None
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise InvalidArgument(
                    f"invalid offset {offset!r} for stream '{stream}': "
                    "expected an integer >= 0 (the next offset to read)"
                )
            checked[stream] = offset
        object.__setattr__(self, "next_offsets", MappingProxyType(checked))

    def __reduce__(self) -> tuple[type[SourceOffset], tuple[dict[str, int]]]:
        return SourceOffset, (dict(self.next_offsets),)

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> SourceOffset:
        """From the dict Spark hands to latestOffset/partitions/commit."""
        if not isinstance(value, Mapping):
            raise InvalidArgument(f"invalid npstream offset {value!r}: expected a JSON object")
        return cls(dict(value))  # the values are checked in __post_init__

    @classmethod
    def from_json(cls, text: str) -> SourceOffset:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"invalid npstream offset JSON {text!r}: {exc}") from None
        return cls.from_dict(value)

    def to_dict(self) -> dict[str, int]:
        """The plain dict Spark serialises into the checkpoint."""
        return dict(self.next_offsets)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def get(self, stream: str, default: int | None = None) -> int | None:
        return self.next_offsets.get(stream, default)

    @property
    def streams(self) -> frozenset[str]:
        return frozenset(self.next_offsets)

    def items(self) -> Iterator[tuple[str, int]]:
        return iter(self.next_offsets.items())

    def __contains__(self, stream: object) -> bool:
        return stream in self.next_offsets

    def __len__(self) -> int:
        return len(self.next_offsets)

    def __hash__(self) -> int:
        return hash(tuple(self.next_offsets.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SourceOffset):
            return NotImplemented
        return dict(self.next_offsets) == dict(other.next_offsets)

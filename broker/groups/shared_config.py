"""Settings of a shared group: lease length, delivery limit, backoff, dead letters, ordering.

The wire form (pb.SharedGroupConfig) leaves fields at 0/"" for "default";
this value type holds the resolved settings, checked once, and the JSON form
stored in the group's SQLite row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from npstream.broker.errors import InvalidArgumentError
from npstream.broker.groups.tuning import DEFAULT_ACK_WAIT_MS
from npstream.proto import pb
from npstream.proto.names import validate_stream_name

__all__ = ["DEAD_LETTER_SUFFIX", "SharedConfig"]

# Default dead-letter stream: "<stream>.dlq".
DEAD_LETTER_SUFFIX = ".dlq"
_ORDERINGS = {pb.ORDERING_NONE: "none", pb.ORDERING_KEY: "key"}


@dataclass(frozen=True)
class SharedConfig:
    """Resolved settings of one shared group (every field set)."""

    ack_wait_ms: int = DEFAULT_ACK_WAIT_MS
    max_deliver: int = 0  # 0 = unlimited attempts, never dead-lettered
    backoff_ms: tuple[int, ...] = ()  # delay before attempt 2, 3, ...; the last repeats
    dead_letter_stream: str = ""
    # "none", "key" (key_order.py), or "" in a request that leaves it unspecified:
    # the group keeps what it has (``resolved``).
    ordering: str = "none"

    @classmethod
    def from_pb(cls, stream: str, message: pb.SharedGroupConfig) -> SharedConfig:
        """Resolve defaults and check values; InvalidArgumentError names the bad field."""
        if message.ack_wait_ms < 0:
            raise InvalidArgumentError(
                f"ack_wait_ms={message.ack_wait_ms} for stream '{stream}' must be >= 0"
            )
        if message.max_deliver < 0:
            raise InvalidArgumentError(
                f"max_deliver={message.max_deliver} for stream '{stream}' must be >= 0 "
                "(0 = unlimited)"
            )
        backoff = tuple(int(b) for b in message.backoff_ms)
        if any(b < 0 for b in backoff):
            raise InvalidArgumentError(
                f"backoff_ms={list(backoff)} for stream '{stream}' must all be >= 0"
            )
        dead_letter = message.dead_letter_stream or stream + DEAD_LETTER_SUFFIX
        try:
            validate_stream_name(dead_letter)
        except ValueError as exc:
            raise InvalidArgumentError(f"dead_letter_stream: {exc}") from None
        if dead_letter == stream:
            raise InvalidArgumentError(
                f"dead_letter_stream '{dead_letter}' must differ from the stream itself"
            )
        return cls(
            ack_wait_ms=message.ack_wait_ms or DEFAULT_ACK_WAIT_MS,
            max_deliver=message.max_deliver,
            backoff_ms=backoff,
            dead_letter_stream=dead_letter,
            ordering=_ORDERINGS.get(message.ordering, ""),
        )

    def resolved(self, current: SharedConfig | None) -> SharedConfig:
        """These settings with an unspecified ordering taken from ``current`` ("none": new)."""
        if self.ordering:
            return self
        return replace(self, ordering=current.ordering if current is not None else "none")

    def backoff_after(self, attempt: int) -> int:
        """Delay (ms) before the delivery that follows failed attempt number ``attempt``."""
        if not self.backoff_ms or attempt < 1:
            return 0
        return self.backoff_ms[min(attempt, len(self.backoff_ms)) - 1]

    def exhausted(self, attempt: int) -> bool:
        """True when attempt number ``attempt`` was the last one allowed."""
        return self.max_deliver > 0 and attempt >= self.max_deliver

    def to_pb(self) -> pb.SharedGroupConfig:
        return pb.SharedGroupConfig(
            ack_wait_ms=self.ack_wait_ms,
            max_deliver=self.max_deliver,
            backoff_ms=list(self.backoff_ms),
            dead_letter_stream=self.dead_letter_stream,
            ordering=(pb.ORDERING_KEY if self.ordering == "key" else pb.ORDERING_NONE),
        )

    def to_json(self) -> str:
        return json.dumps({
            "ack_wait_ms": self.ack_wait_ms,
            "max_deliver": self.max_deliver,
            "backoff_ms": list(self.backoff_ms),
            "dead_letter_stream": self.dead_letter_stream,
            "ordering": self.ordering or "none",
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SharedConfig | None:
        """The stored config, None for groups that never were shared (empty JSON)."""
        data = json.loads(text or "{}")
        if not data:
            return None
        return cls(
            ack_wait_ms=int(data["ack_wait_ms"]),
            max_deliver=int(data["max_deliver"]),
            backoff_ms=tuple(int(b) for b in data["backoff_ms"]),
            dead_letter_stream=str(data["dead_letter_stream"]),
            ordering=str(data.get("ordering", "none")),  # absent before ordering by key
        )

    def same_group_settings(self, other: SharedConfig) -> bool:
        """True when the group-wide settings agree (ack_wait is per delivery, not compared)."""
        return (self.max_deliver, self.backoff_ms, self.dead_letter_stream, self.ordering) == (
            other.max_deliver, other.backoff_ms, other.dead_letter_stream, other.ordering)

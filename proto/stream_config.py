"""``StreamConfig``: a stream's effective configuration, one definition for both sides.

The broker's storage, its registry and the SDK's ``npstream.StreamConfig``
all use this class, and every list of its fields (the wire conversion, the
registry's overrides, the broker's per-field defaults) is derived from
``STREAM_CONFIG_FIELDS``, so a new field is added here and in the proto
message, and nowhere else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from npstream.proto import pb

__all__ = ["STREAM_CONFIG_FIELDS", "StreamConfig"]


@dataclass(frozen=True)
class StreamConfig:
    """Effective configuration of a stream; 0 means unlimited / off (see the proto).

    Every field is an integer >= 0, checked on construction so a bad value
    fails where it is made and names the field, not deep inside a write.
    """

    max_age_ms: int = 0  # 0 = keep forever
    max_bytes: int = 0  # 0 = no size limit
    dedup_window_ms: int = 0  # 0 = no dedup
    max_message_bytes: int = 0  # 0 = no limit; value + key + headers of one message

    def __post_init__(self) -> None:
        for name in STREAM_CONFIG_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"stream config {name}={value!r} is invalid: must be an integer >= 0"
                )

    @classmethod
    def from_pb(cls, message: pb.StreamConfig) -> StreamConfig:
        """The config a StreamInfo reports (the broker fills in every field)."""
        return cls(**{name: getattr(message, name) for name in STREAM_CONFIG_FIELDS})

    def to_pb(self) -> pb.StreamConfig:
        return pb.StreamConfig(**{name: getattr(self, name) for name in STREAM_CONFIG_FIELDS})


STREAM_CONFIG_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(StreamConfig))

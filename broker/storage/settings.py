"""Storage configuration: the per-stream config and the engine settings.

The tuning constants no operator sets are in tuning.py.

``StorageSettings`` is the ``[storage]`` table of broker.toml; ``StreamConfig``
(defined in the contract, npstream.proto.stream_config, and shared with the
SDK) is the effective per-stream config the registry hands to
``Storage.open_log``. Both validate themselves on construction, so a bad
value fails where it is typed and names the field, not deep inside a write.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from npstream.broker.errors import InvalidArgumentError
from npstream.proto.stream_config import StreamConfig  # the contract's, one definition

__all__ = [
    "MAX_SEGMENT_BYTES",
    "METADATA_SYNC_MODES",
    "AckMode",
    "StorageSettings",
    "StreamConfig",
]

# Index entries store positions and relative offsets as uint32, so a segment
# can never be larger than this (segment_bytes is capped to it).
MAX_SEGMENT_BYTES = 2**32 - 1


METADATA_SYNC_MODES = ("normal", "full")


@dataclass(frozen=True)
class StorageSettings:
    """Engine-wide settings: the ``[storage]`` table of broker.toml, and its defaults.

    The broker's configuration takes the defaults of its ``[storage]`` keys
    from these fields and hands this object, validated, to ``Storage``; the
    engine's own tests build it directly. ``data_dir`` is the ``[server]`` key
    (the broker keeps more than streams there); ``metadata_sync`` is for the
    broker's SQLite metadata, which the engine does not touch.
    """

    data_dir: Path
    segment_bytes: int = 64 * 1024 * 1024
    segment_age_ms: int = 24 * 3600 * 1000
    max_open_files: int = 256
    max_open_logs: int = 1024  # streams whose log state stays in memory while idle
    flush_interval_ms: int = 50
    max_batch_bytes: int = 8 * 1024 * 1024  # group-commit coalescing bound
    retention_check_interval_ms: int = 5000
    index_interval_bytes: int = 4096
    metadata_sync: str = "normal"

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        minimums = {
            "segment_bytes": 1024,
            "segment_age_ms": 1,
            "max_open_files": 8,
            "max_open_logs": 1,
            "flush_interval_ms": 1,
            "max_batch_bytes": 1024,
            "retention_check_interval_ms": 1,
            "index_interval_bytes": 1,
        }
        problems = []
        for field, minimum in minimums.items():
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                problems.append(f"storage setting {field}={value!r} is invalid: "
                                f"must be an integer >= {minimum}")
        if isinstance(self.segment_bytes, int) and self.segment_bytes > MAX_SEGMENT_BYTES:
            problems.append(f"storage setting segment_bytes={self.segment_bytes} is invalid: "
                            f"must be <= {MAX_SEGMENT_BYTES} (positions are stored as uint32)")
        if self.metadata_sync not in METADATA_SYNC_MODES:
            problems.append(f"storage setting metadata_sync={self.metadata_sync!r} is invalid: "
                            "use normal or full")
        if problems:  # all of them at once: a broker refusing to start names every fix
            raise InvalidArgumentError("; ".join(problems))


class AckMode(enum.Enum):
    """When an append returns: after the covering fsync, or once written to the OS."""

    FSYNC = "fsync"
    WRITE = "write"

"""Storage configuration: the per-stream config, the engine settings and the tuning constants.

``StorageSettings`` is the ``[storage]`` table of broker.toml; ``StreamConfig`` is
the effective per-stream config the registry hands to ``Storage.open_log``.
Both validate themselves on construction, so a bad value fails where it is
typed and names the field, not deep inside a write.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from npstream.broker.errors import InvalidArgumentError

__all__ = [
    "MAX_SEGMENT_BYTES",
    "MIN_READ_BYTES",
    "SCAN_CHUNK_BYTES",
    "AckMode",
    "StorageSettings",
    "StreamConfig",
]

# --------------------------------------------------------------- tuning constants
# Smallest pread issued when walking frames for a fetch. Small fetches of small
# batches then cost one system call instead of one per frame header.
MIN_READ_BYTES = 64 * 1024
# Read size when a whole segment is scanned (recovery, index rebuild, repair).
# Large enough that the per-call overhead vanishes next to the CRC work,
# small enough not to hold a 64 MiB buffer per scanning thread.
SCAN_CHUNK_BYTES = 4 * 1024 * 1024
# Index entries store positions and relative offsets as uint32, so a segment
# can never be larger than this (segment_bytes is capped to it).
MAX_SEGMENT_BYTES = 2**32 - 1


@dataclass(frozen=True)
class StreamConfig:
    """Effective per-stream config; every field set (0 = off/unlimited where noted)."""

    max_age_ms: int  # 0 = keep forever
    max_bytes: int  # 0 = no size limit
    dedup_window_ms: int  # 0 = no dedup
    max_message_bytes: int  # 0 = no limit

    def __post_init__(self) -> None:
        for field in ("max_age_ms", "max_bytes", "dedup_window_ms", "max_message_bytes"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(
                    f"stream config {field}={value!r} is invalid: must be an integer >= 0"
                )


@dataclass(frozen=True)
class StorageSettings:
    """Engine-wide settings, the ``[storage]`` table of broker.toml."""

    data_dir: Path
    segment_bytes: int = 64 * 1024 * 1024
    segment_ms: int = 24 * 3600 * 1000
    max_open_files: int = 256
    flush_interval_ms: int = 50
    max_batch_bytes: int = 8 * 1024 * 1024  # group-commit coalescing bound
    retention_check_interval_ms: int = 5000
    index_interval_bytes: int = 4096

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        minimums = {
            "segment_bytes": 1024,
            "segment_ms": 1,
            "max_open_files": 4,
            "flush_interval_ms": 1,
            "max_batch_bytes": 1024,
            "retention_check_interval_ms": 1,
            "index_interval_bytes": 1,
        }
        for field, minimum in minimums.items():
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidArgumentError(
                    f"storage setting {field}={value!r} is invalid: must be an integer >= {minimum}"
                )
        if self.segment_bytes > MAX_SEGMENT_BYTES:
            raise InvalidArgumentError(
                f"storage setting segment_bytes={self.segment_bytes} is invalid: "
                f"must be <= {MAX_SEGMENT_BYTES} (positions are stored as uint32)"
            )


class AckMode(enum.Enum):
    """When an append returns: after the covering fsync, or once written to the OS."""

    FSYNC = "fsync"
    WRITE = "write"

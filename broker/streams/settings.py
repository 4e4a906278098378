"""The streams package's settings: the ``[streams]`` section of broker.toml, and the
rule a stream's max_message_bytes obeys.

They live here, not in npstream.broker.server.config (which reads them from
broker.toml and re-exports them), so that the registry takes its settings
without importing the server layer (the import contracts in pyproject.toml).
"""

from __future__ import annotations

from dataclasses import dataclass

from npstream.proto.stream_config import STREAM_CONFIG_FIELDS, StreamConfig

__all__ = ["StreamsSettings", "allows_max_message_bytes"]


@dataclass(frozen=True)
class StreamsSettings:
    """``[streams]``: auto-creation, and the config of every stream that did not set its own."""

    auto_create_streams: bool
    default_max_age_ms: int
    default_max_bytes: int
    default_dedup_window_ms: int
    default_max_message_bytes: int

    @property
    def stream_defaults(self) -> StreamConfig:
        """The ``default_<field>`` keys as a StreamConfig (what a stream without overrides gets)."""
        return StreamConfig(**{f: getattr(self, f"default_{f}") for f in STREAM_CONFIG_FIELDS})


def allows_max_message_bytes(value: int, limit: int) -> bool:
    """Whether a stream may have this max_message_bytes (the default or its own), given the
    broker's ``limit`` (ServerSettings.max_message_bytes_limit: half its gRPC limit)."""
    return 1 <= value <= limit

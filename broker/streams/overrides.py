"""A stream's config overrides: which a user may set, and the config they make over the defaults.

Only the fields a user set explicitly are stored (rows.py); the rest follow
the broker-wide defaults, so changing a default in broker.toml applies to
every stream that never overrode it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from npstream.broker.errors import InvalidArgumentError
from npstream.broker.storage import StreamConfig
from npstream.broker.streams.settings import allows_max_message_bytes
from npstream.proto.stream_config import STREAM_CONFIG_FIELDS

__all__ = ["ConfigOverrides"]


class ConfigOverrides:
    """The broker's stream defaults and the limits an override is checked against."""

    def __init__(self, defaults: StreamConfig, max_message_bytes_limit: int) -> None:
        self._defaults = defaults
        self._limit = max_message_bytes_limit

    def effective(self, overrides: Mapping[str, int]) -> StreamConfig:
        if not overrides:
            return self._defaults
        own = {f: int(overrides[f]) for f in STREAM_CONFIG_FIELDS if f in overrides}
        return dataclasses.replace(self._defaults, **own)

    def check(self, name: str, overrides: Mapping[str, int]) -> dict[str, int]:
        """The overrides as ints; InvalidArgumentError naming the first one refused."""
        checked: dict[str, int] = {}
        for field, value in overrides.items():
            if field not in STREAM_CONFIG_FIELDS:
                raise InvalidArgumentError(f"unknown stream config field '{field}'")
            if value < 0:
                raise InvalidArgumentError(
                    f"{field}={value} for stream '{name}' must be >= 0"
                )
            if field == "max_message_bytes" and not allows_max_message_bytes(value, self._limit):
                raise InvalidArgumentError(
                    f"max_message_bytes={value} for stream '{name}' must be within "
                    f"1..{self._limit} "
                    "(half of the broker's grpc_max_message_bytes)"
                )
            checked[field] = int(value)
        return checked

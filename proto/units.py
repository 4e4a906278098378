"""Parsing of times, durations and sizes, shared by the SDK, the CLI, broker.toml and Spark options.

One parser per kind so that "7d", "1GiB" or "2025-01-01T00:00:00Z" mean the
same thing everywhere a user can type them.
"""

from __future__ import annotations

import datetime as dt
import re

__all__ = ["EPOCH", "datetime_from_ms", "parse_duration_ms", "parse_size", "parse_timestamp_ms"]

# Every time on the wire and on disk is milliseconds since this instant (UTC).
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
                "w": 604_800_000}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_MULT = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def datetime_from_ms(ms: int) -> dt.datetime:
    """The UTC datetime of epoch milliseconds (exact: no float rounding on the way)."""
    return EPOCH + dt.timedelta(milliseconds=ms)


def parse_timestamp_ms(value: object) -> int:
    """Epoch milliseconds from a datetime, an ISO-8601 string or an int (epoch ms).

    Naive datetimes and ISO strings without an offset are taken as UTC. A
    numeric string is epoch milliseconds too.
    """
    if isinstance(value, bool):
        raise ValueError(
            f"invalid timestamp {value!r}: use a datetime, an ISO-8601 string or epoch milliseconds"
        )
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return int(moment.timestamp() * 1000)
    if isinstance(value, dt.date):
        return parse_timestamp_ms(dt.datetime(value.year, value.month, value.day))
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        try:
            parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"invalid timestamp {value!r}: use ISO-8601 (2025-01-01T00:00:00Z) "
                "or epoch milliseconds"
            ) from None
        return parse_timestamp_ms(parsed)
    raise ValueError(
        f"invalid timestamp {value!r}: use a datetime, an ISO-8601 string or epoch milliseconds"
    )


def parse_duration_ms(value: object) -> int:
    """Milliseconds from a timedelta, seconds (int/float) or a string like "500ms", "30s", "7d".

    A bare number in a string is seconds, like a bare int or float.
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, dt.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"invalid duration {value!r}: must be >= 0")
        return int(value * 1000)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            number, unit = match.groups()
            return int(float(number) * _DURATION_MS[unit or "s"])
    raise ValueError(
        f"invalid duration {value!r}: use seconds or a number with a unit "
        "(ms, s, m, h, d, w), e.g. '30s' or '7d'"
    )


def parse_size(value: object) -> int:
    """Bytes from an int or a string like "512", "64MiB", "1GB"."""
    if isinstance(value, bool):
        raise ValueError(f"invalid size {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid size {value!r}: must be >= 0")
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            number, unit = match.groups()
            return int(float(number) * _SIZE_MULT[(unit or "b").lower()])
    raise ValueError(
        f"invalid size {value!r}: use bytes or a number with a unit (KiB, MiB, GiB, KB, MB, GB)"
    )

"""Argument checks shared by the parts of ``Client``.

Names, offsets and unit strings are checked before a round trip so that a
mistake fails at once, and always as ``InvalidArgument`` (the broker would
answer the same, a round trip later). The parts of the client (stream admin,
publishing, reading) use these so each check is written once.
"""

from __future__ import annotations

import datetime as dt
import numbers
from collections.abc import Callable

from npstream.errors import InvalidArgument
from npstream.proto.field_ranges import RANGES
from npstream.proto.names import validate_stream_name

__all__ = ["Duration", "Size", "checked_int", "checked_offset", "checked_stream",
           "checked_wait_ms", "parsed"]

Duration = float | int | dt.timedelta | str
Size = int | str


def checked_stream(name: object) -> str:
    """``name`` when it is a valid stream name."""
    try:
        return validate_stream_name(name)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def parsed(parser: Callable[[object], int], parameter: str, value: object) -> int:
    """``parser(value)``, with its complaint naming ``parameter``."""
    try:
        return parser(value)
    except ValueError as exc:
        raise InvalidArgument(f"{parameter}: {exc}") from None


def checked_int(parameter: str, value: object, field: str) -> int:
    """``value`` when it is an int (not a bool) within the contract's range for ``field``.

    ``field`` is the request field it is sent in ("FetchRequest.offset"); its
    range is the broker's (npstream.proto.field_ranges), so a value the wire
    cannot carry fails here naming the caller's argument, not in protobuf.
    """
    bounds = RANGES[field]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"{parameter} must be an int within {bounds.describe()}, "
                              f"got {value!r}")
    number = int(value)
    if not bounds.low <= number <= bounds.high:
        raise InvalidArgument(f"{parameter}={value} is out of range: accepted "
                              f"{bounds.describe()}")
    return number


def checked_offset(parameter: str, value: object, field: str = "FetchRequest.offset") -> int:
    """``value`` when it is an offset the contract accepts in ``field`` (0..2**63-1)."""
    return checked_int(parameter, value, field)


def checked_wait_ms(parameter: str, seconds: float, field: str) -> int:
    """``seconds`` as the milliseconds sent in ``field``, checked against its range."""
    most = RANGES[field].high / 1000
    if seconds != seconds or seconds < 0 or seconds > most:
        raise InvalidArgument(f"{parameter} must be seconds within 0..{most:g}, got {seconds!r}")
    return int(seconds * 1000)

"""Argument checks shared by the parts of ``Client``.

Names, offsets and unit strings are checked before a round trip so that a
mistake fails at once, and always as ``InvalidArgument`` (the broker would
answer the same, a round trip later). The parts of the client (stream admin,
publishing, reading) use these so each check is written once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from npstream.errors import InvalidArgument
from npstream.proto.names import validate_stream_name

__all__ = ["Duration", "Size", "checked_offset", "checked_stream", "parsed"]

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


def checked_offset(parameter: str, value: object) -> int:
    """``value`` when it is an offset (an int >= 0, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"{parameter} must be an offset (int >= 0), got {value!r}")
    return value

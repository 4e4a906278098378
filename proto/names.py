"""Stream and group name rules, checked the same way by the broker and the client.

Stream names become directory names on the broker, so this check is a security
boundary: it admits no path separators, no leading dot and never `.`/`..`.
"""

from __future__ import annotations

import re

__all__ = [
    "GROUP_NAME_RE",
    "NAME_RULE",
    "STREAM_NAME_RE",
    "validate_group_name",
    "validate_stream_name",
]

STREAM_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
GROUP_NAME_RE = STREAM_NAME_RE
# The rule above in words, for every error message and option description that states it.
NAME_RULE = "1-255 characters from [A-Za-z0-9._-], starting with a letter or digit"


def validate_stream_name(name: object) -> str:
    """Return name if it is a valid stream name, else raise ValueError saying why."""
    if not isinstance(name, str) or not STREAM_NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid stream name {name!r}: use {NAME_RULE}"
        )
    return name


def validate_group_name(name: object) -> str:
    """Return name if it is a valid group name, else raise ValueError saying why."""
    if not isinstance(name, str) or not GROUP_NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid group name {name!r}: use {NAME_RULE}"
        )
    return name

"""Stream names and ListStreams page tokens: the rules every stream RPC checks first.

Apart from the registry because the cluster's fan-out and the groups check
them too without needing the registry itself.
"""

from __future__ import annotations

import base64
import binascii

from npstream.broker.errors import InvalidArgumentError
from npstream.proto.names import validate_stream_name

__all__ = ["check_stream_name", "literal_prefix", "next_page_token", "page_after"]


def next_page_token(last: str) -> str:
    """The ListStreams page token of the page after the name ``last``.

    Only a name, so any member of a cluster can continue a listing another
    member began (npstream.broker.cluster.fanout merges the members' pages).
    """
    return base64.urlsafe_b64encode(last.encode()).decode()


def page_after(token: str) -> str:
    """The name a page token continues after ("" for none); InvalidArgumentError if bad."""
    if not token:
        return ""
    try:
        return base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidArgumentError(f"invalid page_token {token!r}") from None


def check_stream_name(name: object) -> str:
    """The name, or InvalidArgumentError stating the naming rule."""
    try:
        return validate_stream_name(name)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None


def literal_prefix(pattern: str) -> str:
    """The part of a glob before its first wildcard: every match starts with it."""
    for index, char in enumerate(pattern):
        if char in "*?[":
            return pattern[:index]
    return pattern



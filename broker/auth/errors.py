"""The auth package's error: a tokens file the broker refuses (never sent to a client)."""

from __future__ import annotations

__all__ = ["TokensFileError"]


class TokensFileError(ValueError):
    """A tokens file the broker refuses (at start: no start; at a reload: the old table stays)."""

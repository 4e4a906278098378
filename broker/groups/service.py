"""GroupService: the gRPC face of consumer groups (cursor and shared models).

Work in progress: the servicer is being written; until then nothing is
registered, so the broker serves without GroupService.
"""

from __future__ import annotations

from typing import Any

__all__ = ["add_to_server"]


def add_to_server(server: Any, ctx: Any) -> None:
    """Register GroupService on ``server``; returns what the broker closes at shutdown."""
    return None

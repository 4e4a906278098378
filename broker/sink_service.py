"""SinkService: the gRPC face of exactly-once writes (Stage, CommitBatch, AbortBatch, SinkState).

Work in progress: the servicer is being written; until then nothing is
registered, so the broker serves without SinkService.
"""

from __future__ import annotations

from typing import Any

__all__ = ["add_to_server"]


def add_to_server(server: Any, ctx: Any) -> None:
    """Register SinkService on ``server`` after running sink recovery; returns a closeable."""
    return None

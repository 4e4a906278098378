"""The storage engine's own errors, handled inside the broker.

An untrusted index file (the segment is scanned instead) and a failed write
that could not be undone (the stream refuses writes: a DiskIOError to the
client). The engine's errors a client sees are BrokerErrors
(npstream.broker.errors).
"""

from __future__ import annotations

__all__ = ["IndexFileError", "UndoFailedError"]


class IndexFileError(ValueError):
    """An index file that cannot be trusted; the segment is scanned instead."""


class UndoFailedError(OSError):
    """A failed write could not be removed again: the files no longer match the log."""

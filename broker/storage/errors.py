"""The storage engine's own errors, handled inside the broker.

An untrusted index file (the segment is scanned instead), a failed write
that could not be undone (the stream refuses writes: a DiskIOError to the
client), a truncation asked to cut inside a frame (a caller's bug: sink
recovery and replication cut at frame boundaries) and a small record file
that does not parse (stream_files.py; ignored with a warning). The
engine's errors a client sees are BrokerErrors (npstream.broker.errors).
"""

from __future__ import annotations

__all__ = ["FrameBoundaryError", "GroupCommitClosedError", "IndexFileError", "UndoFailedError",
           "UnreadableFile"]


class IndexFileError(ValueError):
    """An index file that cannot be trusted; the segment is scanned instead."""


class UndoFailedError(OSError):
    """A failed write could not be removed again: the files no longer match the log."""


class FrameBoundaryError(ValueError):
    """truncate_to was asked to cut inside a stored frame; nothing was changed.

    Frames are the unit of replication and of the files' checks (CRC), so a
    cut keeps whole frames: ``frame_start`` and ``frame_end`` are the offsets
    a cut may use instead.
    """

    def __init__(self, stream: str, offset: int, frame_start: int, frame_end: int) -> None:
        super().__init__(
            f"stream '{stream}': cannot truncate to offset {offset}, inside the frame holding "
            f"offsets [{frame_start}, {frame_end}); truncate to {frame_start} or {frame_end} "
            "(the log was not changed)")
        self.stream = stream
        self.offset = offset
        self.frame_start = frame_start
        self.frame_end = frame_end


class UnreadableFile(ValueError):
    """A small file that exists but does not parse (its content is not what was written)."""


class GroupCommitClosedError(RuntimeError):
    """``submit`` after ``close`` of a group commit: nothing will flush the item."""

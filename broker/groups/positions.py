"""Where a group starts or seeks to: earliest, latest, an offset, or a timestamp.

An offset outside ``[start_offset, end_offset]`` is clamped to the nearer
end and the result says which, so a caller learns that the messages it asked
for are gone (or not written yet) instead of silently reading elsewhere. A
timestamp maps to the first message appended at or after it (end_offset when
none), through the log's time index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from npstream.broker.errors import InvalidArgumentError
from npstream.proto import pb

if TYPE_CHECKING:
    from npstream.broker.storage import StreamLog

__all__ = ["Resolved", "resolve_start"]


class Resolved(NamedTuple):
    offset: int
    clamped_to_start: bool = False
    clamped_to_end: bool = False


def resolve_start(stream_log: StreamLog, where: pb.StartFrom | None,
                  *, required: bool = False) -> Resolved:
    """The offset for ``where``; absent means earliest unless required (then an error)."""
    choice = where.WhichOneof("position") if where is not None else None
    start, end = stream_log.start_offset, stream_log.end_offset
    if choice is None:
        if required:
            raise InvalidArgumentError(
                f"no position given for stream '{stream_log.name}': use earliest, latest, "
                "an offset or a timestamp"
            )
        return Resolved(start)
    assert where is not None
    if choice == "earliest":
        return Resolved(start)
    if choice == "latest":
        return Resolved(end)
    if choice == "offset":
        offset = where.offset
        if offset < start:
            return Resolved(start, clamped_to_start=True)
        if offset > end:
            return Resolved(end, clamped_to_end=True)
        return Resolved(offset)
    return Resolved(min(max(stream_log.offset_for_timestamp(where.timestamp_ms), start), end))

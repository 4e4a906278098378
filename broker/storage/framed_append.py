"""Appends of rows already framed: prebuilt frames copied and staged files adopted as segments.

The exactly-once sink stages its rows as frames before its commit knows
where they go (prebuilt.py, staged_segment.py); the commit hands them to the
appender (appender.py) as one ``FramedAppend``, which is written alone, in
one piece, under the append lock: each payload stamped in place with its
offsets and the append's timestamp, never rebuilt, no dedup applied (ids of
frames flagged as carrying producer ids still enter the dedup window), and
fsynced before the append returns (AckMode.FSYNC) like any other.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate

import pyarrow as pa

from npstream.broker.errors import InvalidArgumentError
from npstream.broker.storage.prebuilt import PrebuiltFrame
from npstream.broker.storage.segment_store import SegmentStore
from npstream.broker.storage.staged_segment import StagedSegment, Stamp, stamp_all
from npstream.broker.storage.value_schemas import ValueSchemas

__all__ = ["FramedAppend", "check_versions", "write_parts"]


@dataclass(frozen=True)
class FramedAppend:
    """Rows already framed, for the appender's one entry point (module docstring).

    ``parts`` are frames to copy into the log (prebuilt.py) and staged files
    to adopt as segments (staged_segment.py), in offset order.
    ``before_write(first_offset, timestamp)`` runs under the append lock
    before any byte is written; if it raises, nothing is written.
    ``timestamp`` (sink recovery: the interrupted commit's) replaces the
    clock if it is not older than the log's last timestamp. With
    ``expect_first``, ValueError unless the log ends there.

    A failure after some parts were written (an adoption cannot be undone:
    the staged file has moved) leaves the log refusing writes until it is
    reopened, like a disk error; a caller that recorded where the append
    started finishes it from there.
    """

    parts: Sequence[PrebuiltFrame | StagedSegment]
    before_write: Callable[[int, int], None] | None = None
    timestamp: int | None = None
    expect_first: int | None = None

    @property
    def count(self) -> int:
        return sum(part.count for part in self.parts)


def check_versions(parts: Sequence[PrebuiltFrame | StagedSegment], stream: str,
                   schemas: ValueSchemas) -> None:
    """InvalidArgumentError unless every frame is in a value schema version of the stream.

    Staged frames were framed for the stream's schema at Stage time; the
    sink checks at commit that the version still means the same schema
    (a stream deleted and re-created meanwhile), this is storage's own
    guard that no frame lands in a stream that could not decode it.
    """
    versions = {part.schema_version for part in parts if isinstance(part, PrebuiltFrame)}
    versions.update(slot.schema_version for part in parts
                    if isinstance(part, StagedSegment) for slot in part.slots)
    wrong = sorted(v for v in versions if (v not in schemas.values if schemas.typed else v))
    if wrong:
        raise InvalidArgumentError(
            f"stream '{stream}' is "
            + (f"typed (value schema versions {sorted(schemas.values)})" if schemas.typed
               else "untyped")
            + f", but frames to append are in value schema version {wrong[0]}"
            + (" (0: untyped)" if not wrong[0] else "") + "; nothing was written")


def write_parts(store: SegmentStore, parts: Sequence[PrebuiltFrame | StagedSegment],
                first: int, now: int) -> list[pa.RecordBatch]:
    """Write runs of frames and adopt staged files in order, from offset ``first``; lock held.

    Returns the stamped batches of frames flagged as carrying producer ids.
    """
    flagged: list[pa.RecordBatch] = []
    bases = list(accumulate((part.count for part in parts), initial=first))
    staged = {index: part for index, part in enumerate(parts)
              if isinstance(part, StagedSegment)}
    # Staged files are stamped first, all at once: nothing is in the log yet, so a
    # failure there leaves it unchanged, and the stamps' disk waits overlap.
    stamps = dict(zip(staged, stamp_all([(part, bases[i]) for i, part in staged.items()],
                                        now, store.schemas.stored_schema), strict=True))
    reached = first
    try:
        for begin, end, write in _write_steps(store, parts, bases, stamps, now):
            flagged += store.write_at_tail(bases[begin], now, write)
            reached = bases[end]
    except BaseException as exc:
        if reached > first:  # part of the append is in the log and cannot be undone
            failure = exc if isinstance(exc, OSError) else OSError(
                errno.EIO, f"append stopped at offset {reached} after writing part of "
                f"it: {exc}")
            store.fail(failure)
        raise
    return flagged


def _write_steps(store: SegmentStore, parts: Sequence[PrebuiltFrame | StagedSegment],
                 bases: list[int], stamps: dict[int, Stamp], now: int,
                 ) -> Iterator[tuple[int, int, Callable[[], list[pa.RecordBatch]]]]:
    """(first part, part after the last, write) of each step of write_parts.

    Each stamped file (every StagedSegment: ``stamps`` holds their indexes)
    is adopted alone; a run of frames is written at once.
    """
    files = store.files
    stored_schema = store.schemas.stored_schema
    run_start = 0
    frames: list[PrebuiltFrame] = []
    for i, part in enumerate(parts):
        if not isinstance(part, StagedSegment):
            if not frames:
                run_start = i
            frames.append(part)
            continue
        if frames:
            yield run_start, i, partial(files.write_prebuilt, frames, bases[run_start], now,
                                        stored_schema)
            frames = []
        yield i, i + 1, partial(files.adopt, part, bases[i], stamps[i])
    if frames:
        yield run_start, len(parts), partial(files.write_prebuilt, frames, bases[run_start],
                                             now, stored_schema)

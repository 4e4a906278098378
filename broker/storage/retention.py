"""Retention: which whole segments a stream's config no longer keeps.

Rules (applied oldest segment first, never to the active segment):

- segments wholly below the start offset (moved by delete_before) go;
- with ``max_age_ms``: a closed segment goes when its newest message is older
  than ``now - max_age_ms``. When every closed segment has gone that way and
  the active segment's newest message is too old as well, the whole log has
  expired: the active segment is rolled and deleted too (``expire_tail``), so an
  idle stream does not keep expired data forever. Offsets keep growing;
- with ``max_bytes``: the oldest closed segments go while the stream is larger
  than ``max_bytes``. The active segment is never deleted for size, so a
  stream can exceed max_bytes by up to one segment.

``plan_retention`` is pure; the log applies the plan. For streams that are not
open, ``idle_stream_check`` looks only at file names, sizes and the small
headers of sealed index files and of the clean-shutdown marker, so checking
10,000 idle streams costs a directory listing each, and the storage then
skips a stream until the earliest time anything in it can expire.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from npstream.broker.errors import CorruptRecordError
from npstream.broker.storage.files import list_segment_bases, segment_path, time_index_path
from npstream.broker.storage.settings import StreamConfig
from npstream.broker.storage.stream_files import (
    UnreadableFile,
    read_clean_shutdown,
    read_start_offset,
)

__all__ = ["NEVER", "IdleCheck", "RetentionPlan", "idle_stream_check", "plan_retention"]

NEVER = 2**63 - 1
_SEAL = struct.Struct("<4sBBHQQqq")  # the leading fields of a sealed index file header


class SegmentFacts(Protocol):
    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int


@dataclass(frozen=True)
class RetentionPlan:
    delete_count: int  # leading closed segments to delete
    expire_tail: bool  # the active segment's data has expired as well
    reason: str

    @property
    def needed(self) -> bool:
        return self.delete_count > 0 or self.expire_tail


def plan_retention(
    segments: Sequence[SegmentFacts], config: StreamConfig, now_ms: int, start_offset: int
) -> RetentionPlan:
    """What retention deletes now from ``segments`` (oldest first; the last is active)."""
    closed = len(segments) - 1
    count = 0
    reasons: list[str] = []
    while count < closed and segments[count].next_offset <= start_offset:
        count += 1
    if count:
        reasons.append(f"below start offset {start_offset}")
    expire_tail = False
    if config.max_age_ms > 0 and segments:
        cutoff = now_ms - config.max_age_ms
        before = count
        while count < closed and segments[count].max_timestamp < cutoff:
            count += 1
        tail = segments[-1]
        expire_tail = count == closed and tail.size > 0 and tail.max_timestamp < cutoff
        if count > before or expire_tail:
            reasons.append(f"older than max_age_ms={config.max_age_ms}")
    if config.max_bytes > 0 and not expire_tail:
        total = sum(segment.size for segment in segments[count:])
        before = count
        while count < closed and total > config.max_bytes:
            total -= segments[count].size
            count += 1
        if count > before:
            reasons.append(f"over max_bytes={config.max_bytes}")
    return RetentionPlan(count, expire_tail, ", ".join(reasons))


@dataclass
class _IdleSegment:
    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int


@dataclass(frozen=True)
class IdleCheck:
    """Outcome of checking a stream that is not open."""

    must_open: bool  # retention has work to do, or the files need a real look
    next_due_ms: int  # when to look again if nothing is to be done (NEVER: not by age)


def _sealed_facts(directory: Path, base: int) -> _IdleSegment | None:
    """Facts of a closed segment from its time index header, None unless it matches the file."""
    try:
        with open(time_index_path(directory, base), "rb") as index:
            head = index.read(_SEAL.size)
        stat = os.stat(segment_path(directory, base))
    except FileNotFoundError:
        return None
    if len(head) < _SEAL.size:
        return None
    _magic, _version, _size, _reserved, size, mtime_ns, next_offset, max_ts = _SEAL.unpack(head)
    if (size, mtime_ns) != (stat.st_size, stat.st_mtime_ns):
        return None
    return _IdleSegment(base, next_offset, size, max_ts)


def idle_stream_check(directory: Path, config: StreamConfig, now_ms: int) -> IdleCheck:
    """Whether retention must open the (not open) stream in ``directory`` now."""
    if config.max_age_ms <= 0 and config.max_bytes <= 0:
        return IdleCheck(False, NEVER)
    bases = list_segment_bases(directory)
    if not bases:
        return IdleCheck(False, NEVER)
    facts: list[_IdleSegment] = []
    for base in bases[:-1]:
        fact = _sealed_facts(directory, base)
        if fact is None:
            return IdleCheck(True, NEVER)  # index missing or stale: let recovery look
        facts.append(fact)
    try:
        marker = read_clean_shutdown(directory)
    except UnreadableFile:
        return IdleCheck(True, NEVER)  # recovery looks at it (and says what it found)
    tail_path = segment_path(directory, bases[-1])
    try:
        tail_size = os.stat(tail_path).st_size
    except FileNotFoundError:
        return IdleCheck(False, NEVER)
    if marker is None or (marker.segment, marker.size) != (bases[-1], tail_size):
        return IdleCheck(True, NEVER)  # not closed cleanly: open once to recover it
    facts.append(_IdleSegment(bases[-1], marker.next_offset, tail_size, marker.max_timestamp))
    try:
        start = max(read_start_offset(directory) or 0, bases[0])
    except CorruptRecordError:
        return IdleCheck(True, NEVER)
    plan = plan_retention(facts, config, now_ms, start)
    if plan.needed:
        return IdleCheck(True, NEVER)
    oldest = next((fact for fact in facts if fact.size > 0), None)
    if config.max_age_ms <= 0 or oldest is None:
        return IdleCheck(False, NEVER)
    return IdleCheck(False, oldest.max_timestamp + config.max_age_ms + 1)

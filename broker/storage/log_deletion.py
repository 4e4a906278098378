"""Deleting from a StreamLog: the start offset moved, whole segments dropped, truncation.

``delete_before`` and ``delete_all`` move the logical start offset (a small
file, stream_files.py) and delete the segments wholly below it; retention
(retention.py decides, ``apply_retention`` applies) deletes whole segments
the same way; ``truncate_to`` cuts the end (sink recovery). All under the
append lock, the new view published before files go.
"""

from __future__ import annotations

import logging

from npstream.broker.errors import OffsetOutOfRangeError
from npstream.broker.log_events import event_fields
from npstream.broker.storage.log_state import LogState
from npstream.broker.storage.retention import plan_retention
from npstream.broker.storage.stream_files import write_start_offset

__all__ = ["Deletion"]

log = logging.getLogger(__name__)



class Deletion(LogState):
    """StreamLog's deletions and retention (log.py); the fields are LogState's."""

    # ------------------------------------------------------------------ deletion

    def delete_before(self, offset: int) -> None:
        """Make ``offset`` the start offset; delete the segments wholly below it."""
        with self._append_lock:
            self._check_usable()
            view = self._view
            if offset < 0 or offset > view.end:
                raise OffsetOutOfRangeError(self.name, offset, view.start, view.end)
            if offset <= view.start:
                return
            if offset == view.end:
                self._delete_all_locked(f"delete_before({offset})")
                return
            write_start_offset(self._directory, offset)
            self._publish_view_locked(start=offset)
            if self._dedup is not None:
                self._dedup.forget_below(offset)
            segments = self._segments.segments
            doomed = 0
            while segments[doomed].next_offset <= offset:
                doomed += 1
            self._delete_head_locked(doomed, f"delete_before({offset})")

    def delete_all(self) -> None:
        """Make start_offset = end_offset; later appends continue from the same end offset."""
        with self._append_lock:
            self._check_usable()
            self._delete_all_locked("delete_all")

    def _delete_all_locked(self, reason: str) -> None:
        tail = self._segments.tail
        if tail is None:
            return
        if not tail.is_empty:
            self._segments.roll(reason)
        end = self._view.end
        write_start_offset(self._directory, end)
        if self._dedup is not None:
            self._dedup.clear()
        self._delete_head_locked(len(self._segments) - 1, reason)
        self._publish_view_locked(start=end)

    def _delete_head_locked(self, count: int, reason: str) -> None:
        """Drop the first ``count`` (closed) segments: from the view first, then the files."""
        if count <= 0:
            return
        doomed = self._segments.detach_head(count)
        start = max(self._view.start, self._segments.segments[0].base_offset)
        self._publish_view_locked(start=start)
        if self._dedup is not None:
            self._dedup.forget_below(start)
        self._segments.delete_files(doomed)
        log.info("stream %s: %s deleted %d segment(s) with offsets [%d, %d) (%d bytes); "
                 "start offset is %d", self.name, reason, count, doomed[0].base_offset,
                 doomed[-1].next_offset, sum(segment.size for segment in doomed), start,
                 extra=event_fields(stream=self.name, start_offset=start,
                                    count=doomed[-1].next_offset - doomed[0].base_offset))

    def truncate_to(self, offset: int) -> None:
        """Drop messages [offset, end): the end offset becomes ``offset`` (sink recovery)."""
        with self._append_lock:
            self._check_usable()
            view = self._view
            if offset < view.start or offset > view.end:
                raise OffsetOutOfRangeError(self.name, offset, view.start, view.end)
            if offset == view.end:
                return
            self.flush()
            self._segments.truncate(view, offset)
            if self._dedup is not None:
                self._dedup.forget_from(offset)
            self._publish_view_locked()
            log.info("stream %s: truncated to offset %d (%d messages removed)",
                     self.name, offset, view.end - offset,
                     extra=event_fields(stream=self.name, end_offset=offset))

    # ------------------------------------------------------------------ retention, config

    def apply_retention(self, now_ms: int) -> int:
        """Delete the segments retention no longer keeps; returns how many were deleted."""
        with self._append_lock:
            if self._closed is not None or self._failure is not None or not len(self._segments):
                return 0
            plan = plan_retention(self._segments.segments, self._config, now_ms,
                                  self._view.start)
            before = len(self._segments)
            if plan.expire_tail:
                self._delete_all_locked(f"retention ({plan.reason})")
                return before
            self._delete_head_locked(plan.delete_count, f"retention ({plan.reason})")
            return plan.delete_count

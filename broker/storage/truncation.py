"""Cutting a stream's log at either end: start offset moves, retention, truncation to an offset.

``delete_before`` and ``delete_all`` move the logical start offset (a small
file, stream_files.py) and delete the segments wholly below it; retention
(retention.py decides, ``apply_retention`` applies) deletes whole segments
the same way. ``truncate_to`` cuts the end back to an offset at a frame
boundary (sink recovery; a replica catching up with its leader): later
segments deleted, the segment holding the offset cut there with its indexes
rebuilt, the dedup window and the clean-shutdown marker brought in line, and
the next append gets that offset. All under the append lock, the new view
published before files go.
"""

from __future__ import annotations

import logging

from npstream.broker.errors import OffsetOutOfRangeError
from npstream.broker.log_events import event_fields
from npstream.broker.storage.errors import FrameBoundaryError
from npstream.broker.storage.reader import iter_frames
from npstream.broker.storage.retention import plan_retention
from npstream.broker.storage.segment_store import SegmentStore
from npstream.broker.storage.stream_files import remove_clean_shutdown, write_start_offset
from npstream.proto.frames.record_batch import FrameHeader

__all__ = ["Truncation"]

log = logging.getLogger(__name__)


class Truncation:
    """Deletions, retention and truncation of one log (module docstring); thread-safe."""

    __slots__ = ("_store",)

    def __init__(self, store: SegmentStore) -> None:
        self._store = store

    # ------------------------------------------------------------------ the start

    def delete_before(self, offset: int) -> None:
        """Make ``offset`` the start offset; delete the segments wholly below it."""
        store = self._store
        with store.lock:
            store.check_usable()
            view = store.view
            if offset < 0 or offset > view.end:
                raise OffsetOutOfRangeError(store.name, offset, view.start, view.end)
            if offset <= view.start:
                return
            if offset == view.end:
                self._delete_all_locked(f"delete_before({offset})")
                return
            write_start_offset(store.directory, offset)
            store.publish_view(start=offset)
            if store.dedup is not None:
                store.dedup.forget_below(offset)
            segments = store.files.segments
            doomed = 0
            while segments[doomed].next_offset <= offset:
                doomed += 1
            self._delete_head_locked(doomed, f"delete_before({offset})")

    def delete_all(self) -> None:
        """Make start_offset = end_offset; later appends continue from the same end offset."""
        with self._store.lock:
            self._store.check_usable()
            self._delete_all_locked("delete_all")

    def apply_retention(self, now_ms: int) -> int:
        """Delete the segments retention no longer keeps; returns how many were deleted."""
        store = self._store
        with store.lock:
            if store.closed is not None or store.failure is not None or not len(store.files):
                return 0
            plan = plan_retention(store.files.segments, store.config, now_ms, store.view.start)
            before = len(store.files)
            if plan.expire_tail:
                self._delete_all_locked(f"retention ({plan.reason})")
                return before
            self._delete_head_locked(plan.delete_count, f"retention ({plan.reason})")
            return plan.delete_count

    def _delete_all_locked(self, reason: str) -> None:
        store = self._store
        tail = store.files.tail
        if tail is None:
            return
        if not tail.is_empty:
            store.files.roll(reason)
        end = store.view.end
        write_start_offset(store.directory, end)
        if store.dedup is not None:
            store.dedup.clear()
        self._delete_head_locked(len(store.files) - 1, reason)
        store.publish_view(start=end)

    def _delete_head_locked(self, count: int, reason: str) -> None:
        """Drop the first ``count`` (closed) segments: from the view first, then the files."""
        if count <= 0:
            return
        store = self._store
        doomed = store.files.detach_head(count)
        start = max(store.view.start, store.files.segments[0].base_offset)
        store.publish_view(start=start)
        if store.dedup is not None:
            store.dedup.forget_below(start)
        store.files.delete_files(doomed)
        log.info("stream %s: %s deleted %d segment(s) with offsets [%d, %d) (%d bytes); "
                 "start offset is %d", store.name, reason, count, doomed[0].base_offset,
                 doomed[-1].next_offset, sum(segment.size for segment in doomed), start,
                 extra=event_fields(stream=store.name, start_offset=start,
                                    count=doomed[-1].next_offset - doomed[0].base_offset))

    # ------------------------------------------------------------------ the end

    def truncate_to(self, offset: int) -> None:
        """Drop messages [offset, end): the end offset becomes ``offset``.

        OffsetOutOfRangeError outside [start, end]; FrameBoundaryError when
        ``offset`` is inside a stored frame: frames are cut whole, as a replica
        holds the leader's frames byte for byte. Nothing is changed when it raises.
        """
        store = self._store
        with store.lock:
            store.check_usable()
            view = store.view
            if offset < view.start or offset > view.end:
                raise OffsetOutOfRangeError(store.name, offset, view.start, view.end)
            if offset == view.end:
                return
            self._check_frame_boundary(offset)
            store.flush()
            # A marker would describe a tail this cut replaces: without it the next open
            # checks the whole tail segment, as after a crash.
            remove_clean_shutdown(store.directory)
            store.files.truncate(view, offset)
            if store.dedup is not None:
                store.dedup.forget_from(offset)
            store.publish_view()
            log.info("stream %s: truncated to offset %d (%d messages removed)",
                     store.name, offset, view.end - offset,
                     extra=event_fields(stream=store.name, end_offset=offset))

    def _check_frame_boundary(self, offset: int) -> None:
        """FrameBoundaryError unless a stored frame starts at ``offset`` (headers read only)."""
        store = self._store

        def starts_at_offset(header: FrameHeader) -> bool:
            if header.base_offset < offset:
                raise FrameBoundaryError(store.name, offset, header.base_offset,
                                         header.next_offset)
            return False  # the first frame from ``offset`` on is all it takes

        for _frame in iter_frames(store.view, store.cache, offset, wants=starts_at_offset):
            break

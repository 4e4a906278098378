"""Walk the frames of a segment file region with few, large preads.

Used both by fetches (which read a few frames from an indexed position) and by
scans (recovery, index rebuild, repair, which read a whole segment). Every
frame handed out has passed its structural checks and its CRC32C, so a fetch
never sends bytes that are not what was written.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from npstream.proto.frames.record_batch import (
    HEADER_SIZE,
    FrameError,
    FrameHeader,
    frame_crc,
    parse_header,
)

__all__ = ["BadFrame", "FrameReader"]


class BadFrame(Exception):
    """The frame at ``position`` failed a check.

    ``past_end`` is set when the frame (or its header) does not fit before the
    end of the region: what a write cut short by a crash looks like.
    """

    def __init__(self, position: int, detail: str, *, past_end: bool = False,
                 crc_mismatch: bool = False, frame_end: int = -1) -> None:
        super().__init__(f"byte {position}: {detail}")
        self.position = position
        self.detail = detail
        self.past_end = past_end
        self.crc_mismatch = crc_mismatch
        self.frame_end = frame_end


class FrameReader:
    """Frames of ``fd`` from byte ``start`` up to byte ``end`` (exclusive), in order.

    Reads ``read_size`` bytes at a time (or a whole frame, when larger). With
    ``large_frame`` (bytes, 0: off) a frame of at least that size is read by
    itself (plus the next frame's header), and the first read is at most that
    long: a fetch of a few large frames then reads what it returns, not up to
    ``read_size`` bytes past it (a 16 MiB read returning one 10 MB frame read
    the next frame twice: once partly, once whole to find it did not fit).
    """

    def __init__(self, fd: int, start: int, end: int, *, read_size: int,
                 large_frame: int = 0) -> None:
        self.fd = fd
        self.position = start  # where the next frame starts
        self.end = end
        self.read_size = read_size
        self.large_frame = large_frame
        self._buffer = b""
        self._buffer_start = start

    def next_frame(
        self, wants: Callable[[FrameHeader], bool] | None = None,
    ) -> tuple[int, FrameHeader, memoryview] | None:
        """(position, header, payload) of the next frame, None at the end; raises BadFrame.

        ``wants(header)`` False also returns None, before the frame's payload
        is read or checked (the reader stays at that frame).
        """
        position = self.position
        if position >= self.end:
            return None
        if self.end - position < HEADER_SIZE:
            raise BadFrame(position, f"{self.end - position} bytes left, less than a frame header",
                           past_end=True)
        self._ensure(position, HEADER_SIZE)
        relative = position - self._buffer_start
        try:
            header = parse_header(self._buffer, relative)
        except FrameError as exc:
            raise BadFrame(position, str(exc)) from None
        frame_end = position + header.frame_size
        if frame_end > self.end:
            raise BadFrame(
                position,
                f"frame of {header.frame_size} bytes runs past the end at byte {self.end}",
                past_end=True,
            )
        if wants is not None and not wants(header):
            return None
        self._ensure(position, header.frame_size)
        relative = position - self._buffer_start
        actual = frame_crc(self._buffer, relative, header)
        if actual != header.crc:
            raise BadFrame(
                position,
                f"CRC mismatch: stored {header.crc:#010x}, computed {actual:#010x}",
                crc_mismatch=True, frame_end=frame_end,
            )
        payload = memoryview(self._buffer)[relative + HEADER_SIZE : relative + header.frame_size]
        self.position = frame_end
        return position, header, payload

    def _ensure(self, position: int, length: int) -> None:
        """Make [position, position + length) available in the buffer (one pread if not)."""
        relative = position - self._buffer_start
        if relative >= 0 and relative + length <= len(self._buffer):
            return
        size = max(length, self.read_size)
        if self.large_frame:
            if length >= self.large_frame:
                size = length + HEADER_SIZE  # this frame and the next one's header
            elif not self._buffer:
                size = max(length, min(self.read_size, self.large_frame))
        size = min(self.end - position, size)
        data = os.pread(self.fd, size, position)
        if len(data) < length:
            raise BadFrame(position, f"file ends at byte {position + len(data)}, "
                           f"{length} bytes needed", past_end=True)
        self._buffer = data
        self._buffer_start = position

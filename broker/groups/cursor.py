"""A cursor group (npayload / OKMQ model): one committed offset that pulls read from.

``pull`` returns the stored Arrow batches as they are (no per-row work) and,
with auto-commit, moves the cursor past them under the group's lock, so
concurrent pullers of one group never get the same messages. Without
auto-commit nothing moves until ``commit``: the same messages come back.
A cursor below the stream's start (retention, delete_before removed
messages the group had not read) stays there, so DescribeGroup reports the
removed range (a reader starting from the group can fail on the loss), and
a pull continues at the start (one WARNING per gap) and moves it with its
auto-commit; one past the end waits for new data. A typed
stream's batches go out in MESSAGE_SCHEMA with each record as JSON bytes
(typed_values.py), like every group delivery.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from npstream.broker.errors import BrokerError, OffsetOutOfRangeError
from npstream.broker.groups.store import PositionWriter
from npstream.broker.groups.tuning import LONG_POLL_SLICE_S
from npstream.broker.groups.typed_values import untyped_batch
from npstream.broker.log_events import event_fields
from npstream.proto.frames.payload import decode_payload

if TYPE_CHECKING:
    from npstream.broker.storage import ReadResult, StreamLog

__all__ = ["CursorGroup", "PullResult"]

log = logging.getLogger(__name__)


class PullResult:
    """Stored batches returned by one pull, and the cursor after it."""

    __slots__ = ("batches", "count", "next_offset", "ticket")

    def __init__(self, batches: list[bytes | memoryview], count: int, next_offset: int,
                 ticket: int) -> None:
        self.batches = batches
        self.count = count
        self.next_offset = next_offset
        self.ticket = ticket  # PositionWriter ticket of the auto-commit (0: none)


def _delivered(stream_log: StreamLog, result: ReadResult) -> list[bytes | memoryview]:
    """A pull's batches as sent: stored bytes, or a typed stream's with JSON values."""
    if not result.schema_version:
        return result.batches
    schema = stream_log.value_schemas.stored_schema(result.schema_version)
    return [untyped_batch(decode_payload(data, schema)).serialize().to_pybytes()
            for data in result.batches]


class CursorGroup:
    """One cursor group of one stream; thread-safe."""

    kind = "cursor"

    def __init__(self, stream: str, group: str, *, committed: int, dead_lettered: int = 0,
                 writer: PositionWriter,
                 on_pull: Callable[[int], None] | None = None) -> None:
        self.stream = stream
        self.group = group
        self._writer = writer
        self._on_pull = on_pull  # told each non-empty pull's count (the group's metrics)
        self._lock = threading.Lock()
        self._committed = committed
        self._dead_lettered = dead_lettered  # only ever 0 for cursors; kept for the row
        self._closed: BrokerError | None = None
        self._gap_logged = -1  # the start offset of the last removed range logged

    def _check_open_locked(self) -> None:
        if self._closed is not None:
            raise self._closed

    def _set_locked(self, offset: int) -> int:
        if offset == self._committed:
            return 0
        self._committed = offset
        return self._writer.put(self.stream, self.group, offset, self._dead_lettered)

    def _effective_locked(self, stream_log: StreamLog) -> int:
        """Where the next pull reads: the cursor, or the stream's start when retention
        removed what it pointed at (the cursor stays below it: ``position``)."""
        start, end = stream_log.start_offset, stream_log.end_offset
        if self._committed < start:
            if self._gap_logged != start:
                self._gap_logged = start
                log.warning("group '%s' on stream '%s': offsets [%d, %d) were removed from the "
                            "log before the group read them; pulls continue at %d", self.group,
                            self.stream, self._committed, start, start,
                            extra=event_fields(stream=self.stream, group=self.group,
                                               offset=start))
            return start
        if self._committed > end:
            log.warning("group '%s' on stream '%s': cursor %d is past end_offset %d; "
                        "moving it to %d", self.group, self.stream, self._committed, end, end,
                        extra=event_fields(stream=self.stream, group=self.group, offset=end))
            self._set_locked(end)
        return self._committed

    def position(self, stream_log: StreamLog) -> int:
        """The stored cursor: below the stream's start_offset when retention removed
        messages the group had not read (until a pull, commit or seek moves it)."""
        with self._lock:
            self._effective_locked(stream_log)
            return self._committed

    def pull(self, stream_log: StreamLog, limit: int, wait_s: float, auto_commit: bool,
             should_stop: Callable[[], bool] | None = None) -> PullResult:
        """The next messages after the cursor; long-polls up to wait_s when there are none."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                self._check_open_locked()
                position = self._effective_locked(stream_log)
                if position < stream_log.end_offset:
                    try:
                        result = stream_log.read(position, max_messages=limit, latest=True)
                    except OffsetOutOfRangeError:
                        continue  # retention moved the start between the two lines above
                    if result.count:
                        ticket = self._set_locked(result.next_offset) if auto_commit else 0
                        if self._on_pull is not None:
                            self._on_pull(result.count)
                        return PullResult(_delivered(stream_log, result), result.count,
                                          self._committed, ticket)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (should_stop is not None and should_stop()):
                return PullResult([], 0, position, 0)
            stream_log.wait_for_data(position, min(remaining, LONG_POLL_SLICE_S))
            if should_stop is not None and should_stop():  # gone while it waited: the
                return PullResult([], 0, position, 0)  # data it woke for is not its (auto-commit)

    def commit(self, next_offset: int) -> tuple[int, int]:
        """Set the cursor (already validated by the caller); (cursor, writer ticket)."""
        with self._lock:
            self._check_open_locked()
            ticket = self._set_locked(next_offset)
            return self._committed, ticket

    def seek(self, offset: int) -> int:
        """Move the cursor; pullers see it on their next pull. Returns the writer ticket."""
        with self._lock:
            self._check_open_locked()
            ticket = self._set_locked(offset)
            log.info("group '%s' on stream '%s' moved to offset %d", self.group, self.stream,
                     offset, extra=event_fields(stream=self.stream, group=self.group,
                                                offset=offset))
            return ticket

    def close(self, reason: BrokerError) -> None:
        with self._lock:
            self._closed = reason

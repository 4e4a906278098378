"""Group commit without a writer thread: the first waiting appender writes for everyone queued.

Appenders enqueue a request. If no writer is active, the appender becomes the
*leader*: it takes the requests at the head of the queue (up to
``max_group_bytes``, at least its own; an atomic request always goes alone),
writes them as one stored batch, fsyncs at once if any of them asked for
FSYNC, and then hands leadership to the next queued request. Appends that
arrive during the write or the fsync queue up and become the next group: one
batch and one fsync for all of them. Idle streams hold no thread.

A failed write fails the whole group; a failed fsync fails only the members
that waited for it (WRITE members were written and are acknowledged).

Followers sleep on their own Event until their group is done (or until they
are promoted to leader).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["CommitQueue", "CommitRequest"]

T = TypeVar("T")


@dataclass(eq=False)
class CommitRequest(Generic[T]):
    """One append waiting to be written; the writer fills ``result``."""

    payload: T
    nbytes: int
    fsync: bool
    atomic: bool = False
    result: object = None
    sequence: int = 0  # write sequence number of the group that wrote it (for a later sync)
    error: BaseException | None = None
    done: bool = False
    # Set when the request must wait (a leader is active), under the queue lock: an
    # uncontended append, its own leader, never builds one (~2 us each).
    wake: threading.Event | None = None

    def outcome(self) -> object:
        if self.error is not None:
            raise self.error
        return self.result


class CommitQueue(Generic[T]):
    """Coalesces concurrent requests into groups written by one leader at a time.

    ``write(group)`` writes a group (filling each request's ``result``) and
    returns a write sequence number; ``sync(seq)`` returns once everything up to
    that sequence number is fsynced.
    """

    def __init__(
        self,
        max_group_bytes: int,
        write: Callable[[list[CommitRequest[T]]], int],
        sync: Callable[[int], None],
    ) -> None:
        self.max_group_bytes = max_group_bytes
        self._write = write
        self._sync = sync
        self._lock = threading.Lock()
        self._queue: deque[CommitRequest[T]] = deque()
        self._leader_active = False

    def submit(self, request: CommitRequest[T]) -> object:
        """Queue ``request``; return its result once written (and fsynced if asked)."""
        with self._lock:
            self._queue.append(request)
            leader = not self._leader_active
            self._leader_active = True
            if not leader:
                request.wake = threading.Event()
        if request.wake is not None:
            request.wake.wait()
            if request.done:
                return request.outcome()
        return self._lead(request)

    def _take_group_locked(self) -> list[CommitRequest[T]]:
        group = [self._queue[0]]
        if group[0].atomic:
            return group
        total = group[0].nbytes
        for request in list(self._queue)[1:]:
            if request.atomic or total + request.nbytes > self.max_group_bytes:
                break
            group.append(request)
            total += request.nbytes
        return group

    def _lead(self, request: CommitRequest[T]) -> object:
        with self._lock:
            group = self._take_group_locked()
        assert group[0] is request, "the leader must head the queue"
        write_error: BaseException | None = None
        sync_error: BaseException | None = None
        try:
            sequence = self._write(group)
            if any(member.fsync for member in group):
                try:
                    self._sync(sequence)
                except BaseException as exc:
                    sync_error = exc
        except BaseException as exc:
            write_error = exc
        with self._lock:
            for _ in group:
                self._queue.popleft()
            if self._queue:
                self._queue[0].wake.set()  # type: ignore[union-attr]  # a follower: promote it
            else:
                self._leader_active = False
        for member in group:
            error = write_error or (sync_error if member.fsync else None)
            if error is not None:
                member.error = error
            elif write_error is None:
                member.sequence = sequence
            member.done = True
            if member.wake is not None:  # None: the leader itself
                member.wake.set()
        return request.outcome()

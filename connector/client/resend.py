"""Requests of a streamed ``publish_batch`` kept until answered, so a new call can send them again.

``publish_batch`` of an iterator of tables cannot rewind its input, so when
the broker refuses the stream part way (the stream is being moved to another
broker of the cluster, or moved already: STREAM_MOVING, NOT_OWNER) the
requests it has not answered would be lost. They are not stored: the broker
answers every request it stores, in order, before the status that ends the
call (proto: PublishStream). So the requests taken from the input and not yet
answered (at most the publish window plus one, ~4 MiB each) stay here, and
each new call on the stream sends them first, in order, then goes on with
the input.

Each call reads its requests through its own ``feed()``. gRPC's sending
thread of an ended call may still be taking a request when the next call
starts; a newer feed makes the older ones stop, and whatever an older one
took stays unanswered here, so the newer call sends it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator

__all__ = ["Resendable"]


class Resendable:
    """The unanswered requests of ``requests`` (wire bytes); see the module doc. Thread-safe."""

    def __init__(self, requests: Iterator[bytes]) -> None:
        self._source = requests
        self._lock = threading.Lock()
        self._unanswered: deque[bytes] = deque()
        self._answered = 0  # requests answered so far: the index of the first unanswered
        self._generation = 0

    def feed(self) -> Iterator[bytes]:
        """The requests of a new call: the unanswered ones, then the rest of the input.

        From this call on, older feeds yield nothing more.
        """
        with self._lock:
            self._generation += 1
            generation = self._generation
        return self._requests(generation)

    def _requests(self, generation: int) -> Iterator[bytes]:
        with self._lock:
            position = self._answered
        while True:
            with self._lock:
                if generation != self._generation:
                    return  # a newer call sends from here on
                index = position - self._answered
                if 0 <= index < len(self._unanswered):
                    request = self._unanswered[index]
                else:
                    taken = next(self._source, None)
                    if taken is None:
                        return
                    self._unanswered.append(taken)
                    request = taken
            position += 1
            yield request

    def answered(self) -> int:
        """The oldest unanswered request got its response: its index among all requests."""
        with self._lock:
            self._unanswered.popleft()
            self._answered += 1
            return self._answered - 1

    @property
    def pending(self) -> int:
        """Requests taken from the input and not answered (none were stored)."""
        with self._lock:
            return len(self._unanswered)

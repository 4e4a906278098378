"""Sending the ~4 MiB requests of one ``publish_batch`` with several in flight, in order.

One request at a time costs a round trip plus the broker's fsync per request
(about 2-20 ms for 4 MiB), during which neither side does anything else.
``pipelined`` sends the requests on one ``StreamService.PublishStream`` call
and keeps up to ``window`` of them unanswered: the broker writes request k+1
while request k waits for its fsync, and its group commit folds their fsyncs.
The broker writes requests in arrival order and answers in the same order, so
offsets follow the input order exactly as with sequential unary calls, and a
request has a response if and only if it was stored (proto: PublishStream).

``PublishTally`` turns the responses into the per-row offsets and duplicates of
``BatchPublishResult`` and words the "how much was stored" note of an error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa

from npstream.client.batching import chunk_offsets
from npstream.client.connection import StreamingCall, never_reached_broker
from npstream.client.models import BatchPublishResult
from npstream.errors import BrokerUnavailable, NotSent, NpstreamError, ValueMismatch
from npstream.proto import pb

__all__ = ["PUBLISH_WINDOW", "NotSent", "PublishTally", "RequestPlan", "pipelined"]

# ---------------------------------------------------------------- tuning
# Requests of one publish_batch in flight at once (each up to ~4 MiB, see
# batching.REQUEST_TARGET_BYTES). Two already overlap a write with an fsync;
# four also cover the transfer of the next request. More only buffers memory.
PUBLISH_WINDOW = 4


def pipelined(
    open_call: Callable[[Iterator[bytes]], StreamingCall],
    requests: Iterator[bytes],
    window: int = PUBLISH_WINDOW,
) -> Iterator[pb.PublishResponse]:
    """Responses to ``requests`` (PublishRequest wire bytes) on one call, ``window`` unanswered.

    ``requests`` is consumed lazily by gRPC's sending thread (so encoding the
    next request overlaps waiting for a response). Closing the returned
    iterator early cancels the call. Raises NpstreamError (mapped gRPC status)
    when the call fails (NotSent when gRPC says it never reached a broker),
    and also when it ends with fewer responses than requests sent.
    """
    credits = threading.Semaphore(window)
    abandoned = threading.Event()
    sent = 0

    def paced() -> Iterator[bytes]:
        nonlocal sent
        for request in requests:
            credits.acquire()
            if abandoned.is_set():
                return
            sent += 1
            yield request

    call = open_call(paced())
    received = 0
    try:
        try:
            for response in call:
                received += 1
                credits.release()
                yield response
        except BrokerUnavailable as exc:
            if received == 0 and never_reached_broker(call):
                raise NotSent(str(exc)) from None
            raise
        if received < sent:
            raise NpstreamError(
                f"publish stream ended after {received} of {sent} response(s)"
            )
    finally:
        abandoned.set()
        credits.release()  # wake the sending thread if it waits for a credit
        if received < sent:
            call.cancel()


class RequestPlan:
    """Encodes the requests of a stream of input tables lazily, remembering their rows.

    Iterating yields PublishRequest wire bytes; ``ranges[i]`` is the input-row
    range ``(start, stop)`` of request i, recorded before the request is
    yielded, so a response can always be matched to its rows. Each input table
    is normalized and split (``prepare``) only when the sender reaches it,
    which bounds memory to about the window plus one input table. An error
    from ``prepare`` or the input iterator ends the requests cleanly (the
    broker then answers those already sent) and is kept in ``error``.
    """

    def __init__(self, tables: Iterator[pa.Table],
                 prepare: Callable[[object], tuple[pa.Table, list[tuple[int, int]]]],
                 encode: Callable[[pa.Table], bytes]) -> None:
        self._tables = tables
        self._prepare = prepare
        self._encode = encode
        self.ranges: list[tuple[int, int]] = []
        self.error: Exception | None = None

    def __iter__(self) -> Iterator[bytes]:
        start = 0
        try:
            for item in self._tables:
                table, ranges = self._prepare(item)
                for first, stop in ranges:
                    request = self._encode(table.slice(first, stop - first))
                    self.ranges.append((start + first, start + stop))
                    yield request
                start += table.num_rows
        except Exception as exc:  # reported by the caller once the sent requests are answered
            self.error = exc


class PublishTally:
    """Per-row offsets and duplicates of a publish_batch, built one response at a time."""

    def __init__(self) -> None:
        self._offsets: list[np.ndarray] = []
        self.duplicates: list[tuple[int, int]] = []
        self.first_offset = -1
        self.stored = 0
        self.rows_done = 0  # input rows covered by responses so far

    def add(self, start: int, rows: int, response: pb.PublishResponse) -> None:
        """Account for the response to the request holding input rows [start, start + rows)."""
        pairs = [(d.index, d.offset) for d in response.duplicates]
        self._offsets.append(
            chunk_offsets(rows, response.first_offset, response.stored_count, pairs)
        )
        self.duplicates.extend((start + index, offset) for index, offset in pairs)
        if response.stored_count and self.first_offset < 0:
            self.first_offset = response.first_offset
        self.stored += response.stored_count
        self.rows_done = start + rows

    def note_failure(self, exc: BaseException) -> None:
        """Add to ``exc`` which rows of the batch were stored before it."""
        if not self.rows_done:
            return
        done = self.rows_done
        offsets = np.concatenate(self._offsets)
        rest = ("may or may not have been stored" if isinstance(exc, BrokerUnavailable)
                else "were not")
        exc.add_note(
            f"rows 0..{done - 1} of this batch were stored before the error "
            f"(offsets {int(offsets.min())}..{int(offsets.max())}); rows from {done} on {rest}"
        )
        if isinstance(exc, ValueMismatch):
            exc.add_note(f"the message index in the error counts within the failed request, "
                         f"which starts at row {done} of this batch")

    def result(self) -> BatchPublishResult:
        offsets = np.concatenate(self._offsets) if self._offsets else np.zeros(0, np.int64)
        return BatchPublishResult(first_offset=self.first_offset, stored_count=self.stored,
                                  duplicates=self.duplicates, offsets=offsets.tolist())

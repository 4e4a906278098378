"""The publishing part of ``npstream.Client``: ``publish`` and ``publish_batch``.

Kept apart because publishing is where the client decides how data travels:
one message as a unary call; a table as ~4 MiB Arrow IPC requests, pipelined
on one PublishStream call (``npstream.client.publishing``) with a fallback
to one unary call at a time when the broker lacks PublishStream or the stream
broke where a resend is safe; an iterator of tables streamed without
fallback, since it cannot be rewound (its unanswered requests are kept and
sent again on a new call when the stream moves: resend.py). The retry rule for publishes (no blind
resend without ids) is applied here, per request.
"""

from __future__ import annotations

import functools
import itertools
import logging
import random
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import grpc
import pyarrow as pa
import pyarrow.compute as pc

from npstream.client.batching import (
    encode_ipc_stream,
    encode_publish_request,
    iter_slices,
    row_sizes,
    split_rows,
)
from npstream.client.checks import checked_stream
from npstream.client.connection import (
    RETRY_BACKOFF_MULTIPLIER,
    RETRY_INITIAL_BACKOFF_S,
    RETRY_MAX_BACKOFF_S,
    StreamingCall,
)
from npstream.client.core import ClientCore
from npstream.client.models import BatchPublishResult, PublishManyResult, PublishResult
from npstream.client.publish_many import publish_many
from npstream.client.publishing import NotSent, PublishTally, RequestPlan, pipelined
from npstream.client.resend import Resendable
from npstream.client.routing import MAX_REDIRECTS
from npstream.client.values import encode_headers, encode_key, encode_value, messages_to_table
from npstream.errors import (
    BrokerUnavailable,
    InvalidArgument,
    NotOwner,
    NpstreamError,
    StreamMoving,
)
from npstream.proto import pb
from npstream.proto.schema import normalize_publish_table

__all__ = ["Publisher"]

log = logging.getLogger(__name__)

_ACKS = {"fsync": pb.ACK_FSYNC, "write": pb.ACK_WRITE}


def _ack(ack: str) -> pb.Ack:
    try:
        return _ACKS[ack]
    except (KeyError, TypeError):
        raise InvalidArgument(f"invalid ack {ack!r}: use 'fsync' or 'write'") from None


_NOTHING = object()  # an empty iterable of messages


def _publish_table(data: pa.Table | pa.RecordBatch) -> pa.Table:
    try:
        return normalize_publish_table(data)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def _all_have_ids(table: pa.Table) -> bool:
    """True when every row carries a non-empty id: the broker's dedup makes a resend safe."""
    if "id" not in table.column_names:
        return False
    ids = table.column("id")
    return ids.null_count == 0 and bool(pc.all(pc.greater(pc.binary_length(ids), 0)).as_py())


class _Refusals:
    """How long a streamed publish_batch goes on calling while its stream is moving.

    Like a unary call's retries (connection.py): at least the broker's
    ``retry_after`` apart, with backoff, until ``retry_deadline`` has passed
    since the first refusal in a row; a redirect is followed at once, up to
    MAX_REDIRECTS in a row.
    """

    def __init__(self, retry_deadline: float) -> None:
        self._retry_deadline = retry_deadline
        self.reset()

    def reset(self) -> None:
        self._since: float | None = None
        self._redirects = 0
        self._backoff = RETRY_INITIAL_BACKOFF_S

    def wait(self, refused: NpstreamError, pending: int) -> None:
        """Return when the next call may start; raise ``refused`` past the deadline."""
        now = time.monotonic()
        self._since = now if self._since is None else self._since
        if isinstance(refused, NotOwner):
            self._redirects += 1
            if self._redirects <= MAX_REDIRECTS:
                log.debug("publish stream redirected to %s; resending %d request(s)",
                          refused.owner, pending)
                return
        remaining = self._since + self._retry_deadline - now
        retry_after = refused.retry_after if isinstance(refused, StreamMoving) else 0.0
        sleep = max(retry_after, random.uniform(0, self._backoff))
        if sleep >= remaining:
            refused.add_note(f"gave up resending {pending} request(s) after "
                             f"{self._retry_deadline:g}s")
            raise refused
        log.debug("publish stream refused (%s); resending %d request(s) in %.3fs",
                  type(refused).__name__, pending, sleep)
        time.sleep(sleep)
        self._backoff = min(self._backoff * RETRY_BACKOFF_MULTIPLIER, RETRY_MAX_BACKOFF_S)


class Publisher(ClientCore):
    """Publishing methods of ``Client`` (docs/client.md, "Publishing")."""

    def publish(
        self,
        stream: str,
        value: object,
        id: str | None = None,
        key: bytes | str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        ack: str = "fsync",
    ) -> PublishResult:
        """Append one message; with an ``id`` a resend within the dedup window is a no-op.

        For a typed stream ``value`` is a record (a dict of its fields), sent
        as JSON and checked by the broker against the stream's schema
        (ValueMismatch when it does not fit).
        """
        if id is not None and not isinstance(id, str):
            raise InvalidArgument(f"id must be str, got {type(id).__name__}: {id!r}")
        message = pb.Message(
            id=id or "", value=encode_value(value), headers=encode_headers(headers)
        )
        encoded_key = encode_key(key)
        if encoded_key is not None:
            message.key = encoded_key
        request = pb.PublishRequest(stream=checked_stream(stream), messages=[message],
                                    ack=_ack(ack))
        response = self.call(lambda s: s.StreamService.Publish, request, idempotent=bool(id))
        if response.duplicates:
            return PublishResult(offset=response.duplicates[0].offset, duplicate=True)
        return PublishResult(offset=response.first_offset, duplicate=False)

    def publish_many(
        self,
        entries: Iterable[tuple[str, object] | Mapping[str, Any]],
        ack: str = "fsync",
    ) -> list[PublishManyResult]:
        """Publish to many streams at once: one PublishMany request per ~1,000 entries.

        Each entry is ``(stream, value)`` (one message, ``value`` as for
        ``publish``) or a dict: ``{"stream": s, "value": v}`` with optional
        ``id``, ``key``, ``headers``, or ``{"stream": s, "messages": [...]}``
        with message dicts as ``publish_batch`` takes them. Returns one
        PublishManyResult per entry, in order; an entry that fails (bad name,
        no write right, too large, ...) gets the exception ``publish`` would
        raise as its ``error``, and the others are stored all the same: this
        raises only for a bad ``ack``. Entries for streams held by another
        cluster member follow its redirect. A new stream created by its
        first message is durable before the result comes back whatever
        ``ack`` says; a stream's entries are stored in input order.
        """
        return publish_many(self._brokers, entries, _ack(ack), self._conn.retry_deadline)

    def publish_batch(
        self,
        stream: str,
        messages: (Sequence[Mapping[str, Any]] | pa.Table | pa.RecordBatch
                   | Iterable[pa.Table | pa.RecordBatch]),
        ack: str = "fsync",
    ) -> BatchPublishResult:
        """Append many messages in order, as Arrow IPC requests of about 4 MiB each.

        ``messages`` is a list of dicts (keys value/id/key/headers), a pyarrow
        Table/RecordBatch with PUBLISH_COLUMNS (value required; for a typed
        stream it may be a struct of the schema's fields, and a dict value is
        sent as JSON that the broker parses against the schema), or an iterable
        of such tables (e.g. a generator or ``ParquetFile.iter_batches()``):
        all of them are published in order on one PublishStream call, each
        table read from the iterator only when the requests before it are on
        the wire, so memory stays bounded and building the next table
        overlaps sending the previous ones. A table of
        several requests goes on one PublishStream call with up to
        PUBLISH_WINDOW requests in flight (their fsyncs overlap); offsets still
        follow the input order. Nothing of a request is stored when the broker
        rejects it (e.g. an oversized message); earlier requests stay stored,
        later ones are not stored, and the raised error carries a note saying
        how many rows were stored.
        """
        name = checked_stream(stream)
        ack_mode = _ack(ack)
        if isinstance(messages, (pa.Table, pa.RecordBatch)):
            table = _publish_table(messages)
        else:
            items = iter(messages)
            first = next(items, _NOTHING)
            if first is _NOTHING:
                table = messages_to_table([])
            elif not isinstance(first, (pa.Table, pa.RecordBatch)):
                # dicts, in a list or any iterable
                table = messages_to_table(cast(list[Mapping[str, Any]], [first, *items]))
            else:
                return self._publish_tables(name, itertools.chain([first], items), ack_mode)
        if table.num_rows == 0:
            return BatchPublishResult(first_offset=-1, stored_count=0, duplicates=[], offsets=[])
        safe_to_resend = _all_have_ids(table)
        ranges = split_rows(row_sizes(table))
        tally = PublishTally()
        try:
            if len(ranges) > 1:
                self._publish_pipelined(name, table, ranges, ack_mode, safe_to_resend, tally)
            else:
                self._publish_one_by_one(name, table, ranges, ack_mode, safe_to_resend, tally)
        except NpstreamError as exc:
            tally.note_failure(exc)
            raise
        log.debug("published %d message(s) to '%s' in %d request(s): %d stored, %d duplicate(s)",
                  table.num_rows, name, len(ranges), tally.stored, len(tally.duplicates))
        return tally.result()

    def _publish_tables(
        self, name: str, tables: Iterator[pa.Table | pa.RecordBatch], ack_mode: pb.Ack
    ) -> BatchPublishResult:
        """An iterator of tables as one stream of requests (see publish_batch).

        The tables are built by the caller's iterator while earlier requests
        are in flight. No fallback to unary calls: the input cannot be rewound;
        instead the requests not yet answered are kept (resend.py) and sent
        again on a new call when the stream is being moved or moved away.
        """

        def prepare(item: object) -> tuple[pa.Table, list[tuple[int, int]]]:
            if not isinstance(item, (pa.Table, pa.RecordBatch)):
                raise InvalidArgument("publish_batch iterates pyarrow Tables or RecordBatches, "
                                      f"got {type(item).__name__}")
            table = _publish_table(item)
            return table, split_rows(row_sizes(table)) if table.num_rows else []

        plan = RequestPlan(tables, prepare,
                           lambda part: encode_publish_request(name, ack_mode, part))
        tally = PublishTally()
        requests = Resendable(iter(plan))
        try:
            refusals = _Refusals(self._conn.retry_deadline)
            while True:
                try:
                    for response in pipelined(
                        functools.partial(self._open_publish_stream, name, timeout=None),
                        requests.feed(),
                    ):
                        start, stop = plan.ranges[requests.answered()]
                        tally.add(start, stop - start, response)
                        refusals.reset()
                    break
                except (NotSent, NotOwner, StreamMoving) as refused:
                    # Nothing unanswered was stored (resend.py): wait for the move or
                    # follow the redirect, then send the unanswered requests again.
                    refusals.wait(refused, requests.pending)
                    if isinstance(refused, NotOwner) and refused.owner:
                        self._brokers.learn(name, refused.owner)
                    else:
                        self._brokers.forget(name)
            if plan.error is not None:
                raise plan.error
        except NpstreamError as exc:
            if exc.code == grpc.StatusCode.UNIMPLEMENTED and not tally.rows_done:
                # An older broker: nothing was stored, and the tables already taken
                # from the caller's iterator cannot be given back for unary calls.
                raise NpstreamError(
                    f"the broker at {self.address} has no StreamService.PublishStream (it "
                    "predates it), which publish_batch needs for an iterator of tables; "
                    "nothing was stored: pass one Table (sent with unary calls) or upgrade "
                    "the broker", code=exc.code) from exc
            tally.note_failure(exc)
            raise
        except Exception as exc:  # the caller's iterator failed
            tally.note_failure(exc)
            raise
        log.debug("published %d message(s) to '%s' in %d request(s) from an iterator",
                  tally.rows_done, name, len(plan.ranges))
        return tally.result()

    def _open_publish_stream(self, name: str, requests: Iterator[bytes], *,
                             timeout: float | None) -> StreamingCall:
        """A PublishStream call sending ``requests`` (PublishRequest wire bytes) for stream
        ``name``, to the broker that holds it (asked first in a cluster: an iterator of
        requests cannot be resent after a redirect)."""
        conn = self._brokers.connection(self._brokers.owner_of(name))
        return conn.stream_serialized(lambda s: s.StreamService.PublishStream, requests,
                                      pb.PublishResponse, timeout=timeout)

    def _publish_one_by_one(
        self, name: str, table: pa.Table, ranges: list[tuple[int, int]], ack_mode: pb.Ack,
        safe_to_resend: bool, tally: PublishTally,
    ) -> None:
        """Unary Publish per request, each after the previous one's reply (and retried)."""
        for (start, _stop), part in zip(ranges, iter_slices(table, ranges), strict=True):
            request = pb.PublishRequest(
                stream=name, arrow_stream=encode_ipc_stream(part), ack=ack_mode
            )
            response = self.call(lambda s: s.StreamService.Publish, request,
                                 idempotent=safe_to_resend)
            tally.add(start, part.num_rows, response)

    def _publish_pipelined(
        self, name: str, table: pa.Table, ranges: list[tuple[int, int]], ack_mode: pb.Ack,
        safe_to_resend: bool, tally: PublishTally,
    ) -> None:
        """All requests on one PublishStream call, several in flight (publishing.py).

        Falls back to one unary call at a time from the first request without
        a reply when the broker has no PublishStream (UNIMPLEMENTED), and when
        the stream broke (UNAVAILABLE) where a unary retry would be allowed:
        every row has an id, or the call never reached the broker.
        """
        requests = (encode_publish_request(name, ack_mode, part)
                    for part in iter_slices(table, ranges))
        done = 0
        try:
            for response in pipelined(
                functools.partial(self._open_publish_stream, name,
                                  timeout=self.timeout * len(ranges)),
                requests,
            ):
                start, stop = ranges[done]
                tally.add(start, stop - start, response)
                done += 1
        except NpstreamError as exc:
            unimplemented = exc.code == grpc.StatusCode.UNIMPLEMENTED
            # A redirect (the stream's owner changed since it was looked up) or a
            # stream being moved refused the request it names, storing nothing: the
            # unary calls wait for the move (retried) and follow the redirect.
            retryable = isinstance(exc, (NotSent, NotOwner, StreamMoving)) or (
                isinstance(exc, BrokerUnavailable) and safe_to_resend
            )
            if not (unimplemented or retryable):
                raise
            log.debug("publish stream to '%s' failed after %d of %d request(s) (%s); "
                      "sending the rest one at a time", name, done, len(ranges), exc)
            self._publish_one_by_one(name, table, ranges[done:], ack_mode, safe_to_resend,
                                     tally)

"""Client-side exceptions: one root, one class per failure a caller handles.

``from_rpc_error`` is the single place where a ``grpc.RpcError`` becomes one of
these. The broker names every failure with an ``npstream.v1.ErrorReason`` in
the trailing metadata (``npstream.proto.metadata_keys.REASON``); the class is
chosen from that reason (``REASON_CLASSES``), because one status code can mean
several failures (NOT_FOUND: a stream or a group; FAILED_PRECONDITION: a
stream that needs repair, a sink conflict or missing staging) and message
text is for humans, free to change. Only when a reason is absent (an error
raised by gRPC itself, or a broker that predates reasons) does the status code
decide (``CODE_CLASSES``). OUT_OF_RANGE errors also carry the stream's offsets
as trailing metadata (``npstream.proto.metadata_keys.OFFSET_KEYS``), so
callers such as the Spark reader's data-loss check get numbers, not text to
parse.

Every exception this package raises on purpose derives from ``NpstreamError``;
where a builtin says the same thing (``ValueError``, ``TypeError``,
``LookupError``, ``IndexError``, ``ConnectionError``) the class subclasses it
too, so plain Python ``except`` clauses work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

import grpc

from npstream.proto import metadata_keys, pb

__all__ = [
    "CODE_CLASSES",
    "REASON_CLASSES",
    "AlreadyExists",
    "BrokerInternalError",
    "BrokerUnavailable",
    "CorruptRecord",
    "DiskFull",
    "GroupNotFound",
    "IncompatibleSchema",
    "IndexOutOfRange",
    "InvalidArgument",
    "InvalidArgumentType",
    "InvalidSchema",
    "MessageTooLarge",
    "MoveFailed",
    "NotOwner",
    "NpstreamError",
    "OffsetOutOfRange",
    "Overloaded",
    "PermissionDenied",
    "SinkConflict",
    "StagingNotFound",
    "StreamMoving",
    "StreamNeedsRepair",
    "StreamNotFound",
    "Unauthenticated",
    "ValueMismatch",
    "error_class",
    "from_rpc_error",
    "from_status",
    "reason_of",
]


class NpstreamError(Exception):
    """Root of every error the client raises.

    ``code`` is the gRPC status, if the error came from a call; ``reason`` is
    the ``pb.ErrorReason`` the broker sent with it (None when the error did not
    come from the broker, or the broker sent none): compare it with
    ``pb.ERROR_REASON_*`` when a class is not specific enough.
    """

    code: grpc.StatusCode | None = None
    reason: pb.ErrorReason | None = None

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        reason: pb.ErrorReason | None = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        if reason is not None:
            self.reason = reason


class InvalidArgument(NpstreamError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class MessageTooLarge(InvalidArgument):
    """A message is over the stream's max_message_bytes; nothing of the request was stored."""


class InvalidSchema(InvalidArgument):
    """A value schema that does not parse or uses a type typed streams do not support."""


class IncompatibleSchema(InvalidSchema):
    """A schema change other than added nullable fields and widened types."""


class ValueMismatch(InvalidArgument):
    """A published value does not fit the typed stream's schema; nothing was stored."""


class InvalidArgumentType(NpstreamError, TypeError):
    """An argument of the wrong Python type, caught client-side (no call was made).

    For example a ``MessageTable`` indexed with something other than an int.
    """


class IndexOutOfRange(NpstreamError, IndexError):
    """An index past either end of a client-side sequence (``MessageTable[i]``).

    Not a stream offset: offsets outside a stream raise ``OffsetOutOfRange``.
    """


class StreamNotFound(NpstreamError, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class GroupNotFound(NpstreamError, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(NpstreamError):
    code = grpc.StatusCode.ALREADY_EXISTS


class OffsetOutOfRange(NpstreamError, IndexError):
    """The requested offset lies outside [start_offset, end_offset] of the stream."""

    code = grpc.StatusCode.OUT_OF_RANGE

    def __init__(
        self,
        message: str,
        *,
        stream: str = "",
        offset: int = -1,
        start_offset: int = -1,
        end_offset: int = -1,
    ) -> None:
        super().__init__(message)
        self.stream = stream
        self.offset = offset
        self.start_offset = start_offset
        self.end_offset = end_offset


class StreamNeedsRepair(NpstreamError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class SinkConflict(NpstreamError):
    """The broker refused a sink call given the sink's state (FAILED_PRECONDITION).

    For example: a batch is committed while an earlier batch's commit is
    unfinished, or a batch is aborted after its commit started. Missing
    staging is the subclass StagingNotFound, so one ``except SinkConflict``
    still catches every sink refusal.
    """

    code = grpc.StatusCode.FAILED_PRECONDITION


class StagingNotFound(SinkConflict):
    """A commit lists staging the broker does not hold (aborted, expired or never staged)."""


class CorruptRecord(NpstreamError):
    """A stored record failed its length or CRC check while the broker read it."""

    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(NpstreamError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(NpstreamError, PermissionError):
    """The token is valid but lacks the right (read, write, admin) a call needs on a stream.

    The message names the stream and the missing right; retrying does not
    help until the broker's tokens file grants it (the broker reloads it
    without a restart, and this client's next call uses the new rights).
    """

    code = grpc.StatusCode.PERMISSION_DENIED


class DiskFull(NpstreamError):
    """The broker's disk is full: what the call was to write was not stored.

    Data stored before stays readable (fetches and consumers go on); retry
    the call once space has been freed on the broker. The message names the
    stream.
    """

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Overloaded(NpstreamError):
    """The broker's publish memory budget is used up; nothing of the request was stored.

    The client retries such a call by itself (with backoff, at least
    ``retry_after`` seconds apart) until its ``retry_deadline``; this is
    raised when the broker stayed overloaded that long.
    """

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, *, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds the broker asked the client to wait


class BrokerUnavailable(NpstreamError, ConnectionError):
    """The broker could not be reached within the deadline (after retries)."""

    code = grpc.StatusCode.UNAVAILABLE


class NotOwner(BrokerUnavailable):
    """A redirect: the stream lives on another broker of the cluster, ``owner`` (host:port).

    The client follows redirects by itself and remembers each stream's owner
    (npstream.client.routing), so this reaches a caller only when redirects
    go round (the members disagree on who holds ``stream``) or from a call
    made without the client. A ``BrokerUnavailable``: for this stream, the
    broker asked is the wrong one, and code that reconnects on
    ``ConnectionError`` (a subscription) reconnects to the owner.
    """

    code = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, message: str, *, stream: str = "", owner: str = "") -> None:
        super().__init__(message)
        self.stream = stream
        self.owner = owner


class StreamMoving(BrokerUnavailable):
    """The stream is being moved to another broker of the cluster; nothing of the call was done.

    The client sends such a call again by itself (at least ``retry_after``
    seconds apart, whether or not the call is idempotent) until its
    ``retry_deadline``; once the move is done the old broker redirects to the
    new one and the client follows. Raised when a move outlasted the deadline.
    """

    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self, message: str, *, retry_after: float = 0.0, stream: str = "") -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds the broker asked the client to wait
        self.stream = stream


class MoveFailed(NpstreamError):
    """A stream move cannot go on now (details say why and what to do; see docs/cli.md)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class BrokerInternalError(NpstreamError):
    """INTERNAL: a bug in the broker (its log holds the traceback), or its disk failed.

    A disk error (EIO on a write or fsync) names the stream and says whether
    the stream refuses writes until the broker restarts (docs/broker.md,
    "Disk errors"); the SDK does not retry it.
    """

    code = grpc.StatusCode.INTERNAL


# The class for each reason the broker sends. Every ErrorReason except
# UNSPECIFIED must be here (tests/connector/client/test_error_reasons.py fails
# otherwise), so a reason added to the proto cannot silently fall back to a
# status code.
REASON_CLASSES: Mapping[pb.ErrorReason, type[NpstreamError]] = {
    pb.ERROR_REASON_INVALID_ARGUMENT: InvalidArgument,
    pb.ERROR_REASON_MESSAGE_TOO_LARGE: MessageTooLarge,
    pb.ERROR_REASON_STREAM_NOT_FOUND: StreamNotFound,
    pb.ERROR_REASON_GROUP_NOT_FOUND: GroupNotFound,
    pb.ERROR_REASON_ALREADY_EXISTS: AlreadyExists,
    pb.ERROR_REASON_OFFSET_OUT_OF_RANGE: OffsetOutOfRange,
    pb.ERROR_REASON_STREAM_NEEDS_REPAIR: StreamNeedsRepair,
    pb.ERROR_REASON_SINK_CONFLICT: SinkConflict,
    pb.ERROR_REASON_STAGING_NOT_FOUND: StagingNotFound,
    pb.ERROR_REASON_CORRUPT_RECORD: CorruptRecord,
    pb.ERROR_REASON_SHUTTING_DOWN: BrokerUnavailable,
    pb.ERROR_REASON_UNAUTHENTICATED: Unauthenticated,
    pb.ERROR_REASON_INTERNAL: BrokerInternalError,
    pb.ERROR_REASON_SCHEMA_INVALID: InvalidSchema,
    pb.ERROR_REASON_SCHEMA_INCOMPATIBLE: IncompatibleSchema,
    pb.ERROR_REASON_VALUE_MISMATCH: ValueMismatch,
    pb.ERROR_REASON_PERMISSION_DENIED: PermissionDenied,
    pb.ERROR_REASON_DISK_FULL: DiskFull,
    pb.ERROR_REASON_OVERLOADED: Overloaded,
    pb.ERROR_REASON_NOT_OWNER: NotOwner,
    pb.ERROR_REASON_MEMBER_UNAVAILABLE: BrokerUnavailable,
    pb.ERROR_REASON_STREAM_MOVING: StreamMoving,
    pb.ERROR_REASON_MOVE_FAILED: MoveFailed,
}

# The class when no reason came with the error: gRPC's own failures
# (unreachable broker, deadline) and brokers older than ErrorReason. Where a
# code is ambiguous this picks its most common meaning (NOT_FOUND: a stream).
# INTERNAL is absent on purpose: without the broker's reason it may be a
# transport failure, not a broker bug; it stays a plain NpstreamError.
CODE_CLASSES: Mapping[grpc.StatusCode, type[NpstreamError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: StreamNotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.OUT_OF_RANGE: OffsetOutOfRange,
    grpc.StatusCode.FAILED_PRECONDITION: StreamNeedsRepair,
    grpc.StatusCode.DATA_LOSS: CorruptRecord,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAVAILABLE: BrokerUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: BrokerUnavailable,
}


def _trailing(exc: grpc.RpcError) -> dict[str, str]:
    """The call's trailing metadata as a dict ({} when the error has none)."""
    if not hasattr(exc, "trailing_metadata"):
        return {}
    # grpc returns (key, value) pairs (namedtuples); its stubs declare objects
    # with .key/.value only, which fakes in tests do not have.
    entries = cast(Iterable[tuple[str, str | bytes]], exc.trailing_metadata() or ())
    return {key: value.decode() if isinstance(value, bytes) else value
            for key, value in entries}


def reason_of(meta: Mapping[str, str]) -> pb.ErrorReason | None:
    """The ErrorReason named in trailing metadata; None when absent or unknown to this client."""
    name = meta.get(metadata_keys.REASON)
    if not name:
        return None
    try:
        reason = cast(pb.ErrorReason, pb.ErrorReason.Value(name))
    except ValueError:  # a newer broker's reason: go by the status code
        return None
    return None if reason == pb.ERROR_REASON_UNSPECIFIED else reason


def error_class(reason: pb.ErrorReason | None,
                code: grpc.StatusCode | None) -> type[NpstreamError]:
    """The class for an error: by reason when there is one, else by status code."""
    if reason is not None and reason in REASON_CLASSES:
        return REASON_CLASSES[reason]
    if code is not None and code in CODE_CLASSES:
        return CODE_CLASSES[code]
    return NpstreamError


def from_rpc_error(exc: grpc.RpcError, address: str) -> NpstreamError:
    """Translate a gRPC error into the matching NpstreamError (message kept)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    return from_status(code, details, _trailing(exc), address)


def from_status(code: grpc.StatusCode | None, details: str, meta: Mapping[str, str],
                address: str) -> NpstreamError:
    """The NpstreamError for a status: a failed call's, or one PublishMany entry's
    (``pb.EntryError`` carries the same code, details and trailing metadata)."""
    reason = reason_of(meta)
    cls = error_class(reason, code)
    error: NpstreamError
    if issubclass(cls, OffsetOutOfRange):

        def num(key: str) -> int:
            try:
                return int(meta.get(key, -1))
            except (TypeError, ValueError):
                return -1

        error = cls(
            details,
            stream=meta.get(metadata_keys.STREAM, ""),
            offset=num(metadata_keys.OFFSET),
            start_offset=num(metadata_keys.START_OFFSET),
            end_offset=num(metadata_keys.END_OFFSET),
        )
    elif issubclass(cls, (Overloaded, StreamMoving)):
        try:
            retry_after = max(0.0, int(meta.get(metadata_keys.RETRY_AFTER_MS, 0)) / 1000)
        except (TypeError, ValueError):
            retry_after = 0.0
        error = cls(details, retry_after=retry_after)
    elif issubclass(cls, NotOwner):
        error = cls(details, stream=meta.get(metadata_keys.STREAM, ""),
                    owner=meta.get(metadata_keys.OWNER, ""))
    elif issubclass(cls, BrokerUnavailable):
        error = cls(f"broker at {address} is unavailable: {details}")
    else:
        error = cls(details)
    if code is not None:
        error.code = code
    error.reason = reason
    return error

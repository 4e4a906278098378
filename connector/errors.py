"""Client-side exceptions: one root, one class per failure a caller handles.

``from_rpc_error`` is the single place where a ``grpc.RpcError`` becomes one of
these. The broker names every failure with an ``npstream.v1.ErrorReason`` in
the trailing metadata (``npstream.proto.metadata_keys.REASON``); the class is
chosen from that reason (``REASON_CLASSES``), because one status code can mean
several failures (NOT_FOUND: a stream or a group; FAILED_PRECONDITION: a
stream that needs repair, a sink conflict or missing staging) and message
text is for humans, free to change. Only when a reason is absent (an error
raised by gRPC itself, or a broker that predates reasons) does the status code
decide (``CODE_CLASSES``). Which class a reason becomes, that class's bases
and the status code it travels with are declared once, in the reason's
``(error)`` option in npstream.proto (npstream.proto.error_reasons):
``REASON_CLASSES`` and each class's ``code`` are built from it when this
module is imported, which fails if a class's bases differ from the
declaration. Each class builds itself from a broker status
(``from_broker``), reading the trailing metadata its reason declares:
OUT_OF_RANGE errors carry the stream's offsets
(``npstream.proto.metadata_keys.OFFSET_KEYS``), so callers such as the Spark
reader's data-loss check get numbers, not text to parse.

Every exception this package raises on purpose derives from ``NpstreamError``;
where a builtin says the same thing (``ValueError``, ``TypeError``,
``LookupError``, ``IndexError``, ``ConnectionError``) the class subclasses it
too, so plain Python ``except`` clauses work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Self, cast

import grpc

from npstream.proto import metadata_keys, pb
from npstream.proto.error_reasons import SPECS

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

    ``code`` is the gRPC status, if the error came from a call (a class's
    default is the status its reason declares); ``reason`` is
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

    @classmethod
    def from_broker(cls, details: str, meta: Mapping[str, str], address: str) -> Self:
        """The error for a broker status: its details and trailing metadata (a call's,
        or one PublishMany entry's), from the broker at ``address``."""
        return cls(details)


class InvalidArgument(NpstreamError, ValueError):
    """A bad name, value, option or request shape (the broker's, or caught client-side)."""


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
    """The stream does not exist."""


class GroupNotFound(NpstreamError, LookupError):
    """The consumer group does not exist on the stream."""


class AlreadyExists(NpstreamError):
    """``create_stream`` with another config than the existing stream's (and no exist_ok)."""


class OffsetOutOfRange(NpstreamError, IndexError):
    """The requested offset lies outside [start_offset, end_offset] of the stream."""

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

    @classmethod
    def from_broker(cls, details: str, meta: Mapping[str, str], address: str) -> Self:
        return cls(details, stream=meta.get(metadata_keys.STREAM, ""),
                   offset=_int(meta, metadata_keys.OFFSET, -1),
                   start_offset=_int(meta, metadata_keys.START_OFFSET, -1),
                   end_offset=_int(meta, metadata_keys.END_OFFSET, -1))


class StreamNeedsRepair(NpstreamError):
    """The stream's log is corrupt mid-file: run ``repair_stream``."""


class SinkConflict(NpstreamError):
    """The broker refused a sink call given the sink's state (FAILED_PRECONDITION).

    For example: a batch is committed while an earlier batch's commit is
    unfinished, or a batch is aborted after its commit started. Missing
    staging is the subclass StagingNotFound, so one ``except SinkConflict``
    still catches every sink refusal. The Spark sink raises it on the driver
    too, for a checkpoint that never planned the sink's last committed batch
    (npstream.spark.checkpoint).
    """


class StagingNotFound(SinkConflict):
    """A commit lists staging the broker does not hold (aborted, expired or never staged)."""


class CorruptRecord(NpstreamError):
    """A stored record failed its length or CRC check while the broker read it."""


class Unauthenticated(NpstreamError):
    """No token, or one the broker does not know."""


class PermissionDenied(NpstreamError, PermissionError):
    """The token is valid but lacks the right (read, write, admin) a call needs on a stream.

    The message names the stream and the missing right; retrying does not
    help until the broker's tokens file grants it (the broker reloads it
    without a restart, and this client's next call uses the new rights).
    """


class DiskFull(NpstreamError):
    """The broker's disk is full: what the call was to write was not stored.

    Data stored before stays readable (fetches and consumers go on); retry
    the call once space has been freed on the broker. The message names the
    stream.
    """


class Overloaded(NpstreamError):
    """The broker's publish memory budget is used up; nothing of the request was stored.

    The client retries such a call by itself (with backoff, at least
    ``retry_after`` seconds apart) until its ``retry_deadline``; this is
    raised when the broker stayed overloaded that long.
    """

    def __init__(self, message: str, *, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds the broker asked the client to wait

    @classmethod
    def from_broker(cls, details: str, meta: Mapping[str, str], address: str) -> Self:
        return cls(details, retry_after=_retry_after(meta))


class BrokerUnavailable(NpstreamError, ConnectionError):
    """The broker could not be reached within the deadline (after retries).

    Also what the broker says when it is shutting down, or when a cluster
    member the call needs did not answer (``reason`` tells which).
    """

    @classmethod
    def from_broker(cls, details: str, meta: Mapping[str, str], address: str) -> Self:
        return cls(f"broker at {address} is unavailable: {details}")


class NotOwner(BrokerUnavailable):
    """A redirect: the stream lives on another broker of the cluster, ``owner`` (host:port).

    The client follows redirects by itself and remembers each stream's owner
    (npstream.client.routing), so this reaches a caller only when redirects
    go round (the members disagree on who holds ``stream``) or from a call
    made without the client. A ``BrokerUnavailable``: for this stream, the
    broker asked is the wrong one, and code that reconnects on
    ``ConnectionError`` (a subscription) reconnects to the owner.
    """

    def __init__(self, message: str, *, stream: str = "", owner: str = "") -> None:
        super().__init__(message)
        self.stream = stream
        self.owner = owner

    @classmethod
    def from_broker(cls, details: str, meta: Mapping[str, str], address: str) -> Self:
        return cls(details, stream=meta.get(metadata_keys.STREAM, ""),
                   owner=meta.get(metadata_keys.OWNER, ""))


class StreamMoving(BrokerUnavailable):
    """The stream is being moved to another broker of the cluster; nothing of the call was done.

    The client sends such a call again by itself (at least ``retry_after``
    seconds apart, whether or not the call is idempotent) until its
    ``retry_deadline``; once the move is done the old broker redirects to the
    new one and the client follows. Raised when a move outlasted the deadline.
    """

    def __init__(self, message: str, *, retry_after: float = 0.0, stream: str = "") -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds the broker asked the client to wait
        self.stream = stream

    @classmethod
    def from_broker(cls, details: str, meta: Mapping[str, str], address: str) -> Self:
        return cls(details, retry_after=_retry_after(meta),
                   stream=meta.get(metadata_keys.STREAM, ""))


class MoveFailed(NpstreamError):
    """A stream move cannot go on now (details say why and what to do; see docs/cli.md)."""


class BrokerInternalError(NpstreamError):
    """INTERNAL: a bug in the broker (its log holds the traceback), or its disk failed.

    A disk error (EIO on a write or fsync) names the stream and says whether
    the stream refuses writes until the broker restarts (docs/broker.md,
    "Disk errors"); the SDK does not retry it.
    """


# ------------------------------------------- handled inside the SDK (not in __all__)
# Raised and caught by the SDK's own modules; one reaches a caller only as its
# base class (StagedRowsMoved fails a Spark batch as a NotOwner).


class NotSent(BrokerUnavailable):
    """The streaming call failed before reaching any broker: nothing of it was stored."""


class LocalReadUnavailable(NpstreamError):
    """This range cannot be read locally; ``permanent``: nothing this client reads locally can."""

    def __init__(self, reason: str, *, permanent: bool) -> None:
        super().__init__(reason)
        self.permanent = permanent


class StagedRowsMoved(NotOwner):
    """A commit's staged rows cannot commit where they were staged: their stream moved.

    Rows are staged on the member that holds their stream; a stream moved to
    another member after that (``npstream streams move``, which first waits a
    few seconds for such batches to commit) leaves them on the old member,
    which never appends them (it would create the stream there again).
    Nothing of the commit was appended on that member. Stage the batch again,
    which sends the rows to the new member (``owner``), and commit it there:
    the sink floors that moved with the stream keep the batch exactly once. A
    Spark query fails the batch with this error; restarted from its
    checkpoint it runs the batch again and does exactly that.
    """


class InboxUnavailable(NpstreamError):
    """This process cannot hand data over through the broker's inbox (the reason says why)."""


def _int(meta: Mapping[str, str], key: str, default: int) -> int:
    """A decimal trailing metadata value; ``default`` when absent or not a number."""
    try:
        return int(meta.get(key, default))
    except (TypeError, ValueError):
        return default


def _retry_after(meta: Mapping[str, str]) -> float:
    """The broker's retry hint in seconds (0 when absent or not a number)."""
    return max(0.0, _int(meta, metadata_keys.RETRY_AFTER_MS, 0) / 1000)


def _reason_classes() -> Mapping[pb.ErrorReason, type[NpstreamError]]:
    """The class of each reason, as its (error) option names it; sets each class's ``code``.

    Fails the import when the proto names a class this module lacks or bases
    other than the class's own, so the declaration and the classes cannot drift.
    """
    classes: dict[pb.ErrorReason, type[NpstreamError]] = {}
    for reason, spec in SPECS.items():
        cls = globals().get(spec.client_class)
        if not (isinstance(cls, type) and issubclass(cls, NpstreamError)):
            raise TypeError(f"{spec.name}'s client_class {spec.client_class} is not an "
                            "NpstreamError of npstream.errors")
        bases = tuple(base.__name__ for base in cls.__bases__)
        if bases != spec.client_bases:
            raise TypeError(f"{cls.__name__}'s bases {bases} are not those {spec.name} "
                            f"declares in npstream.proto: {spec.client_bases}")
        cls.code = grpc.StatusCode[spec.status]
        classes[reason] = cls
    return classes


# The class for each reason the broker sends: every ErrorReason except
# UNSPECIFIED, from its (error) option.
REASON_CLASSES: Mapping[pb.ErrorReason, type[NpstreamError]] = _reason_classes()

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
    error = error_class(reason, code).from_broker(details, meta, address)
    if code is not None:
        error.code = code
    error.reason = reason
    return error

"""Typed broker errors, one root, each carrying the values an operator needs.

Every error class names its ``npstream.v1.ErrorReason`` (``reason``); all
else about the reason is declared once, in its ``(error)`` option in
npstream.proto (npstream.proto.error_reasons): the gRPC status code it
travels with (the service layer maps it in one place,
npstream.broker.rpc.status, so this module loads no grpc and the storage
engine may raise these) and the trailing metadata sent beside it, which
``trailing()`` reads from the attributes of the same names. Exactly one class
declares each reason; a more specific error of the same reason subclasses it
(tests/broker/rpc/test_status_reasons.py). Messages always name the stream
and, for offsets, the offending and valid values.
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from npstream.proto import pb
from npstream.proto.error_reasons import SPECS, attribute_of

__all__ = [
    "AlreadyExistsError",
    "BrokerError",
    "CorruptRecordError",
    "DeadLetterElsewhereError",
    "DiskFullError",
    "DiskIOError",
    "GroupNotFoundError",
    "InvalidArgumentError",
    "MemberUnavailableError",
    "MessageTooLargeError",
    "MoveFailedError",
    "NotOwnerError",
    "OffsetOutOfRangeError",
    "OverloadedError",
    "PermissionDeniedError",
    "SchemaIncompatibleError",
    "SchemaInvalidError",
    "ShuttingDownError",
    "SinkConflictError",
    "StagingFormatError",
    "StagingNotFoundError",
    "StreamMovingError",
    "StreamNeedsRepairError",
    "StreamNotFoundError",
    "UnauthenticatedError",
    "ValueMismatchError",
    "is_disk_full",
]


class BrokerError(Exception):
    """Root of every error the broker reports to a client."""

    reason: pb.ErrorReason = pb.ERROR_REASON_INTERNAL

    def trailing(self) -> list[tuple[str, str]]:
        """Trailing metadata sent besides the reason: the keys its (error) option names,
        each from the attribute of the same name (``x-npstream-owner``: ``self.owner``)."""
        return [(key, str(getattr(self, attribute_of(key)))) for key in SPECS[self.reason].trailing]


class InvalidArgumentError(BrokerError, ValueError):
    reason = pb.ERROR_REASON_INVALID_ARGUMENT


class StreamNotFoundError(BrokerError, KeyError):
    reason = pb.ERROR_REASON_STREAM_NOT_FOUND

    def __init__(self, stream: str) -> None:
        super().__init__(f"stream '{stream}' does not exist")
        self.stream = stream

    def __str__(self) -> str:
        return str(self.args[0])


class GroupNotFoundError(BrokerError, KeyError):
    reason = pb.ERROR_REASON_GROUP_NOT_FOUND

    def __init__(self, stream: str, group: str) -> None:
        super().__init__(f"group '{group}' does not exist on stream '{stream}'")
        self.stream = stream
        self.group = group

    def __str__(self) -> str:
        return str(self.args[0])


class SchemaInvalidError(InvalidArgumentError):
    """A value schema that does not parse or uses an unsupported type (names position/field)."""

    reason = pb.ERROR_REASON_SCHEMA_INVALID


class SchemaIncompatibleError(SchemaInvalidError):
    """A schema change the evolution rules refuse (names the field and the rule)."""

    reason = pb.ERROR_REASON_SCHEMA_INCOMPATIBLE


class ValueMismatchError(InvalidArgumentError):
    """A published value does not fit the typed stream's schema; nothing was stored."""

    reason = pb.ERROR_REASON_VALUE_MISMATCH


class AlreadyExistsError(BrokerError):
    reason = pb.ERROR_REASON_ALREADY_EXISTS


class OffsetOutOfRangeError(BrokerError):
    reason = pb.ERROR_REASON_OFFSET_OUT_OF_RANGE

    def __init__(self, stream: str, offset: int, start: int, end: int) -> None:
        super().__init__(
            f"offset {offset} is out of range for stream '{stream}': "
            f"start_offset={start}, end_offset={end}"
        )
        self.stream = stream
        self.offset = offset
        self.start_offset = start
        self.end_offset = end


class MessageTooLargeError(InvalidArgumentError):
    """A message over its stream's max_message_bytes, whichever path found it.

    Publish and commit report it per message ("nothing was stored"), Stage per
    input row ("nothing was staged"); it is the only error of that check
    (npstream.broker.storage.batch_builder.check_message_sizes).
    """

    reason = pb.ERROR_REASON_MESSAGE_TOO_LARGE

    def __init__(self, stream: str, index: int, size: int, limit: int, *,
                 staged: bool = False) -> None:
        what, outcome = ("row", "staged") if staged else ("message", "stored")
        super().__init__(
            f"{what} {index} for stream '{stream}' is {size} bytes, "
            f"over the stream's max_message_bytes={limit}; nothing was {outcome}"
        )
        self.stream = stream
        self.index = index
        self.size = size
        self.limit = limit


class CorruptRecordError(BrokerError):
    """A frame before the tail failed its length or CRC check, or the files hold
    less than recorded (``short``: nothing is damaged, something is missing)."""

    reason = pb.ERROR_REASON_CORRUPT_RECORD

    def __init__(self, path: Path | str, position: int, detail: str, *,
                 short: bool = False) -> None:
        super().__init__(f"corrupt record in {path} at byte {position}: {detail}")
        self.path = Path(path)
        self.position = position
        self.detail = detail
        self.short = short


class StreamNeedsRepairError(BrokerError):
    reason = pb.ERROR_REASON_STREAM_NEEDS_REPAIR

    def __init__(self, stream: str, cause: CorruptRecordError) -> None:
        remedy = ("to accept what the files hold (an incomplete last frame is cut; "
                  "what is missing stays lost)"
                  if cause.short else "to truncate the log there")
        super().__init__(
            f"stream '{stream}' cannot be opened: {cause}; "
            f"run `npstream streams repair {stream}` {remedy}"
        )
        self.stream = stream
        self.cause = cause


class UnauthenticatedError(BrokerError):
    """No token, or one the broker does not know (the auth interceptor, or a reload since)."""

    reason = pb.ERROR_REASON_UNAUTHENTICATED


class PermissionDeniedError(BrokerError):
    """A known token without the right a call needs on a stream.

    The message names the stream and the right, and the token only by the
    name its tokens-file entry gives it: never the token itself.
    """

    reason = pb.ERROR_REASON_PERMISSION_DENIED

    def __init__(self, stream: str, right: str, holder: str, action: str = "") -> None:
        """``stream`` "" for a call that names no stream (it needs the right on some stream)."""
        doing = f" to {action}" if action else ""
        where = f"on stream '{stream}'" if stream else "on any stream"
        super().__init__(
            f"permission denied: token '{holder}' lacks the '{right}' right {where}{doing} "
            "(grant it in the broker's tokens file)")
        self.stream = stream
        self.right = right
        self.holder = holder


class ShuttingDownError(BrokerError):
    reason = pb.ERROR_REASON_SHUTTING_DOWN


class NotOwnerError(BrokerError):
    """A redirect: another member of the cluster holds the stream (or would create it).

    Sent with the owner's advertised address as trailing metadata
    (``metadata_keys.OWNER``), so the client follows it without reading text.
    """

    reason = pb.ERROR_REASON_NOT_OWNER

    def __init__(self, stream: str, owner: str, exists: bool) -> None:
        held = "is held by" if exists else "belongs to (it does not exist yet)"
        super().__init__(f"stream '{stream}' {held} cluster member {owner}: send the call there")
        self.stream = stream
        self.owner = owner


class StreamMovingError(BrokerError):
    """The stream is being moved to another member and takes no writes meanwhile.

    Nothing of the call was done, so any client may send it again after the
    retry hint (trailing ``metadata_keys.RETRY_AFTER_MS``, like OVERLOADED);
    once the move is done the old member redirects to the new one.
    """

    reason = pb.ERROR_REASON_STREAM_MOVING

    def __init__(self, stream: str, target: str, retry_after_ms: int = 200) -> None:
        super().__init__(f"stream '{stream}' is being moved to cluster member {target} and "
                         "takes no writes until the move is done: send the call again")
        self.stream = stream
        self.retry_after_ms = retry_after_ms


class DeadLetterElsewhereError(NotOwnerError):
    """A dead-letter stream that another member holds: it must live with its group's stream.

    A redirect like any NOT_OWNER (the owner travels as trailing metadata),
    with a message that says why the stream must move.
    """

    def __init__(self, name: str, holder: str, here: str) -> None:
        BrokerError.__init__(
            self,
            f"dead-letter stream '{name}' is held by cluster member {holder}, but a shared "
            f"group's dead-letter stream lives with its group's stream, on {here}: move it "
            f"here (npstream streams move {name} --to {here}) or give the group another "
            "dead_letter_stream")
        self.stream = name
        self.owner = holder


class MoveFailedError(BrokerError):
    """The move cannot go on (the target holds another stream of that name, ...)."""

    reason = pb.ERROR_REASON_MOVE_FAILED


class MemberUnavailableError(BrokerError):
    """Another cluster member this call needs did not answer (names it and what it said)."""

    reason = pb.ERROR_REASON_MEMBER_UNAVAILABLE

    def __init__(self, members: str, need: str, detail: str) -> None:
        super().__init__(f"cluster member(s) {members} did not answer, so {need}: {detail}")
        self.members = members


class SinkConflictError(BrokerError):
    """The request contradicts the sink's state (another batch's commit is unfinished)."""

    reason = pb.ERROR_REASON_SINK_CONFLICT


class StagingNotFoundError(BrokerError):
    """A commit lists a staging id the broker does not hold (aborted, expired or never staged)."""

    reason = pb.ERROR_REASON_STAGING_NOT_FOUND


class StagingFormatError(StagingNotFoundError):
    """Sink staging in a staging format this broker does not read (an older broker wrote it).

    Only the current format is read, so for a client such a staging is one
    the broker does not hold, answered like a missing staging; the remedy is
    the same (stage the batch again).
    """

    def __init__(self, path: Path | str, found: int, supported: int) -> None:
        super().__init__(
            f"staging file {path} is in staging format {found}, written by an older broker; "
            f"this broker reads staging format {supported} only: stage the batch again "
            "(the staging sweep deletes the old file after sink_staging_ttl)"
        )
        self.path = Path(path)
        self.found = found
        self.supported = supported


# errno values that mean "no space": the filesystem (ENOSPC) or the user's quota (EDQUOT).
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the data dir running out of space.

    An OSError with ENOSPC/EDQUOT from a file write, or SQLite's SQLITE_FULL
    ("database or disk is full") from a metadata write.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DiskFullError):
            return True
        if isinstance(current, OSError) and current.errno in _NO_SPACE:
            return True
        if (isinstance(current, sqlite3.Error)
                and getattr(current, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL):
            return True
        current = current.__cause__ or current.__context__
    return False


class DiskFullError(BrokerError):
    """The data dir is full: what the call was to write is not stored (docs/broker.md).

    The storage engine undoes a write that runs out of space, so data stored
    before stays readable and the stream takes writes again once space is
    freed. The message names the stream (when the call has one) and what was
    being done.
    """

    reason = pb.ERROR_REASON_DISK_FULL

    def __init__(self, stream: str, action: str, cause: BaseException | str,
                 outcome: str = "nothing of it was stored") -> None:
        where = f" on stream '{stream}'" if stream else ""
        super().__init__(
            f"disk full: {action}{where} failed, the broker's data dir has no space left "
            f"({cause}); {outcome}: free space on the broker's disk and retry")
        self.stream = stream
        self.action = action


class DiskIOError(BrokerError):  # reason INTERNAL, the root's
    """A write or fsync of a stream's files failed with an I/O error, not a full disk (EIO).

    INTERNAL, not UNAVAILABLE: the SDK retries UNAVAILABLE for its retry
    deadline, but this stream refuses writes until the broker is restarted
    (after a failed fsync the kernel may have dropped the pages, so only a
    reopen, which checks the files, can say what is stored), and the disk
    usually needs an operator. A publish that fails so was not acknowledged;
    its rows may or may not be stored (publish with ids: a retry after the
    restart is deduplicated). Other streams keep working. The message names
    the stream; the broker logs the failure at ERROR once per stream.
    """

    def __init__(self, stream: str, action: str, cause: BaseException | str, *,
                 refusing: bool = True) -> None:
        outcome = (f"stream '{stream}' refuses writes until the broker is restarted (reads "
                   "and other streams go on): check the disk, then restart the broker"
                   if refusing else "nothing of it was stored; the stream takes writes again")
        super().__init__(f"disk error on stream '{stream}': {action} failed ({cause}); "
                         f"the call is not acknowledged; {outcome}")
        self.stream = stream
        self.action = action


class OverloadedError(BrokerError):
    """The publish memory budget is used up; nothing of the request was stored.

    ``retry_after_ms`` travels as trailing metadata so that clients wait
    before sending the request again (npstream.broker.rpc.budget).
    """

    reason = pb.ERROR_REASON_OVERLOADED

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms

"""Which streams a sink call writes to, for the access check (docs/broker.md "Security").

A sink call names a sink id and staging ids, not streams: the streams are
the targets of the staged rows. Stage learns them while it routes the rows
(``writable_targets`` wraps its per-target lookup), CommitBatch and
AbortBatch from the index of each staging they name (``staged_targets``).
The right is always ``write``, on every target. Sink ids themselves are not
streams: a commit or abort that names no staging with rows needs ``write``
on some stream. SinkState and StageInbox change nothing and name no stream:
any known token may call them (the interceptor checked it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TypeVar

import grpc

from npstream.broker.auth.access import AccessControl, Right
from npstream.broker.errors import StagingFormatError
from npstream.broker.sink.staging import (
    StagingArea,
    check_batch_id,
    check_sink_id,
    check_staging_id,
)

__all__ = ["require_sink_write", "staged_targets", "writable_targets"]

T = TypeVar("T")


def writable_targets(access: AccessControl, context: grpc.ServicerContext,
                     target_of: Callable[[str], T]) -> Callable[[str], T]:
    """``target_of`` that first requires the caller's write right on the target stream."""

    def checked(stream: str) -> T:
        access.require(context, stream, Right.WRITE, "stage rows for it")
        return target_of(stream)

    return checked


def staged_targets(staging: StagingArea, sink_id: str, batch_id: int,
                   staging_ids: Iterable[str] | None) -> set[str]:
    """The target streams of the named stagings of a batch (all of the batch's when None).

    Ids are checked first (they become paths). A staging that is gone or in
    an older format adds nothing: the call itself then fails or drops it.
    """
    check_sink_id(sink_id)
    check_batch_id(batch_id)
    if staging_ids is None:
        staging_ids = [item.staging_id for item in staging.files()
                       if item.sink_id == sink_id and item.batch_id == batch_id]
    targets: set[str] = set()
    for staging_id in staging_ids:
        check_staging_id(staging_id)
        with contextlib.suppress(FileNotFoundError, StagingFormatError):
            targets.update(staging.targets(sink_id, batch_id, staging_id))
    return targets


def require_sink_write(access: AccessControl, context: grpc.ServicerContext,
                       streams: Iterable[str], action: str) -> None:
    """Write on every stream of ``streams``; with none, write on some stream."""
    streams = set(streams)
    if streams:
        access.require_all(context, streams, Right.WRITE, action)
    else:
        access.require_any(context, Right.WRITE, action)

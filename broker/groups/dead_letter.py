"""Copies messages that ran out of delivery attempts to a dead-letter stream.

The copy keeps the original value, key and headers and adds headers saying
where it came from, so an operator can inspect, fix and re-publish it. Its id
is derived from (stream, group, offset): if the broker crashes after the copy
is stored but before the group records it, the copy made again after the
restart is dropped by the dead-letter stream's dedup window instead of
appearing twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa

from npstream.broker.groups.leases import DeliveryRow
from npstream.proto.schema import HEADERS_TYPE, normalize_publish_table

if TYPE_CHECKING:
    from npstream.broker.streams.registry import StreamRegistry

__all__ = ["DLQ_HEADERS", "DeadLetter", "DeadLetterWriter", "dead_letter_id"]

log = logging.getLogger(__name__)

# Headers added to every dead-letter copy (values are UTF-8 text).
DLQ_HEADERS = {
    "stream": "npstream-dlq-stream",  # stream the message was consumed from
    "group": "npstream-dlq-group",  # shared group that gave up on it
    "offset": "npstream-dlq-offset",  # its offset in that stream
    "id": "npstream-dlq-id",  # its original id
    "timestamp": "npstream-dlq-timestamp",  # its original append time, epoch ms
    "attempts": "npstream-dlq-attempts",  # deliveries made
    "reason": "npstream-dlq-reason",  # how the last one ended: nack or expired
}


class DeadLetter(NamedTuple):
    """A message out of attempts: its row, the deliveries made, how the last one ended."""

    row: DeliveryRow
    attempt: int
    failure: str

    @property
    def offset(self) -> int:
        return self.row.offset


def dead_letter_id(stream: str, group: str, offset: int) -> str:
    return f"dlq:{stream}:{group}:{offset}"


class DeadLetterWriter:
    """Appends dead-letter copies, creating the dead-letter stream on first use."""

    def __init__(self, registry: StreamRegistry,
                 check_create: Callable[[str], None] = lambda _name: None,
                 write_guard: Callable[[str], AbstractContextManager[None]] = (
                     lambda _name: nullcontext())) -> None:
        """``check_create(name)`` raises when the dead-letter stream may not be created here
        (in a cluster: another member holds that name; docs/groups.md); ``write_guard`` is
        entered around the append: it raises when the stream may not be written here now
        (being moved to another member, or gone) and lets a move wait for the append."""
        self._registry = registry
        self._check_create = check_create
        self._write_guard = write_guard

    def write(self, stream: str, group: str, target: str, entries: list[DeadLetter]) -> None:
        """Store copies of entries in target (fsynced); raises BrokerError on failure."""
        if not entries:
            return
        from npstream.broker.storage import AckMode

        headers = []
        for e in entries:
            extra = {
                DLQ_HEADERS["stream"]: stream.encode(),
                DLQ_HEADERS["group"]: group.encode(),
                DLQ_HEADERS["offset"]: str(e.offset).encode(),
                DLQ_HEADERS["id"]: e.row.id.encode(),
                DLQ_HEADERS["timestamp"]: str(e.row.timestamp_ms).encode(),
                DLQ_HEADERS["attempts"]: str(e.attempt).encode(),
                DLQ_HEADERS["reason"]: e.failure.encode(),
            }
            headers.append(list({**e.row.headers, **extra}.items()))
        table = pa.table({
            "value": pa.array([e.row.value for e in entries], pa.binary()),
            "id": pa.array([dead_letter_id(stream, group, e.offset) for e in entries],
                           pa.string()),
            "key": pa.array([e.row.key for e in entries], pa.binary()),
            "headers": pa.array(headers, HEADERS_TYPE),
        })
        with self._write_guard(target):
            if target not in self._registry:
                self._check_create(target)
                self._registry.create(target, {}, exist_ok=True)
            result = self._registry.get(target).append(normalize_publish_table(table),
                                                       AckMode.FSYNC)
        for e in entries:
            log.warning(
                "dead-lettered offset %d of stream '%s' (group '%s') to '%s' after %d "
                "attempt(s), last %s", e.offset, stream, group, target, e.attempt, e.failure)
        log.debug("dead-letter append to '%s' stored %d at offset %d", target,
                  result.stored_count, result.first_offset)

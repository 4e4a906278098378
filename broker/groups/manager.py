"""All groups of the broker: creating, loading, kinds, describing, deleting, upkeep.

Groups are loaded from their SQLite row on first use and then kept in memory
(a cursor is one integer; a shared group holds its leases). A group has one
kind for its life: "cursor" (pull/commit) or "shared" (receive/subscribe
with acks); a group created by Seek alone has kind "" until its first use
decides. Using a group the other way is an INVALID_ARGUMENT error that names
both kinds, because mixing commits with acks on one position would make both
meaningless.

Deleting a group or its stream closes the in-memory group (calls waiting on
it fail with NOT_FOUND), drops queued position writes and then the row, in
that order, so nothing resurrects it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from npstream.broker.errors import (
    BrokerError,
    GroupNotFoundError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    ShuttingDownError,
    StreamMovingError,
    StreamNotFoundError,
)
from npstream.broker.groups.cursor import CursorGroup
from npstream.broker.groups.dead_letter import DeadLetterWriter
from npstream.broker.groups.metrics import GroupMetrics
from npstream.broker.groups.positions import Resolved, resolve_start
from npstream.broker.groups.shared import MemberInfo, SharedGroup
from npstream.broker.groups.shared_config import SharedConfig
from npstream.broker.groups.store import GroupRow, GroupStore, PositionWriter
from npstream.broker.groups.tuning import TICK_INTERVAL_S
from npstream.broker.log_events import event_fields
from npstream.broker.streams.names import check_stream_name
from npstream.proto import pb
from npstream.proto.names import validate_group_name

if TYPE_CHECKING:
    from npstream.broker.metadata import Metadata
    from npstream.broker.storage import StreamLog
    from npstream.broker.streams.registry import StreamRegistry

__all__ = ["GroupManager", "GroupStatus"]

log = logging.getLogger(__name__)

Group = CursorGroup | SharedGroup


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class GroupStatus:
    """What DescribeGroup/ListGroups report for one group."""

    stream: str
    group: str
    kind: str
    committed_offset: int
    end_offset: int
    in_flight: int
    dead_lettered: int
    members: list[MemberInfo]
    config: SharedConfig | None
    # Cursor groups: [start, end) removed before the group read them (retention,
    # delete_messages); its stored position is ``start``. None: nothing was.
    removed_unread: tuple[int, int] | None = None

    @property
    def lag(self) -> int:
        return max(0, self.end_offset - self.committed_offset)


def _removed_unread(stored: int, start: int) -> tuple[int, int] | None:
    """What retention removed below a cursor's stored position, if anything."""
    return (stored, start) if stored < start else None


def check_group_name(name: object) -> str:
    try:
        return validate_group_name(name)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None


def _kind_error(stream: str, group: str, kind: str, wanted: str) -> InvalidArgumentError:
    uses = {"cursor": "pull/commit", "shared": "receive/subscribe/ack/nack"}
    return InvalidArgumentError(
        f"group '{group}' on stream '{stream}' is a {kind} group ({uses[kind]}); "
        f"{uses[wanted]} needs a {wanted} group: use another group name or delete this one"
    )


class GroupManager:
    """The broker's groups; thread-safe. ``close()`` stops upkeep and flushes positions.

    Built from its parts, not from the broker's context (the groups package
    imports nothing of the server layer): npstream.broker.groups.service's
    ``group_manager`` wires one to the context's hooks and metrics.
    """

    def __init__(self, registry: StreamRegistry, metadata: Metadata,
                 dead_letters: DeadLetterWriter, metrics: GroupMetrics,
                 clock: Callable[[], int] = _now_ms) -> None:
        self._registry = registry
        self._clock = clock
        self._store = GroupStore(metadata, clock)
        self._writer = PositionWriter(self._store)
        self._dead_letters = dead_letters
        self.metrics = metrics
        self._lock = threading.RLock()
        self._groups: dict[tuple[str, str], Group] = {}
        self._stop = threading.Event()
        self._drop_orphans()
        self._ticker = threading.Thread(target=self._tick_loop, name="npstream-group-upkeep",
                                        daemon=True)
        self._ticker.start()

    # ------------------------------------------------------------ plumbing

    def _drop_orphans(self) -> None:
        """Rows of streams deleted while the broker was down (listener never ran)."""
        existing = set(self._registry.matching())
        for stream in self._store.streams():
            if stream not in existing:
                count = self._store.delete_stream(stream)
                log.info("dropped %d group(s) of deleted stream '%s'", count, stream)

    def _log(self, stream: str) -> StreamLog:
        return self._registry.get(stream)

    def _names(self, stream: str, group: str) -> tuple[str, str]:
        return check_stream_name(stream), check_group_name(group)

    def _load_locked(self, row: GroupRow) -> Group:
        key = (row.stream, row.group)
        group: Group
        if row.kind == "shared":
            assert row.config is not None
            group = SharedGroup(
                row.stream, row.group, committed=row.committed_offset,
                dead_lettered=row.dead_lettered, config=row.config,
                log_source=lambda: self._log(row.stream), writer=self._writer,
                dead_letters=self._dead_letters,
                metrics=self.metrics.for_group(row.stream, row.group), clock=self._clock)
        else:
            group = CursorGroup(row.stream, row.group, committed=row.committed_offset,
                                dead_lettered=row.dead_lettered, writer=self._writer,
                                on_pull=functools.partial(self.metrics.count_pulled,
                                                          row.stream, row.group))
        self._groups[key] = group
        return group

    def _loaded_locked(self, stream: str, group: str) -> Group | None:
        """The in-memory group, loading it from its row (kind cursor or shared) if needed."""
        found = self._groups.get((stream, group))
        if found is not None:
            return found
        row = self._store.get(stream, group)
        if row is None or row.kind == "":
            return None
        return self._load_locked(row)

    # ------------------------------------------------------------ cursor groups

    def open_cursor(self, stream: str, group: str, start_from: pb.StartFrom | None
                    ) -> tuple[CursorGroup, int, bool, bool]:
        """(group, its position, created, start_from_ignored); creates the group if absent."""
        stream, group = self._names(stream, group)
        stream_log = self._log(stream)
        asked = start_from is not None and start_from.WhichOneof("position") is not None
        with self._lock:
            cursor, created = self._cursor_locked(stream_log, stream, group, start_from)
        if created:
            position = cursor.position(stream_log)
            log.info("created cursor group '%s' on stream '%s' at offset %d", group, stream,
                     position, extra=event_fields(stream=stream, group=group, offset=position))
        return cursor, cursor.position(stream_log), created, asked and not created

    def _cursor_locked(self, stream_log: StreamLog, stream: str, group: str,
                       start_from: pb.StartFrom | None) -> tuple[CursorGroup, bool]:
        found = self._loaded_locked(stream, group)
        if isinstance(found, SharedGroup):
            raise _kind_error(stream, group, "shared", "cursor")
        if found is not None:
            return found, False
        row = self._store.get(stream, group)
        created = False
        if row is not None:  # kind "": positioned by a Seek, first used now
            self._store.set_kind(stream, group, "cursor")
        else:
            offset = resolve_start(stream_log, start_from).offset
            row, created = self._store.create(stream, group, "cursor", offset)
        cursor = self._load_locked(row)
        assert isinstance(cursor, CursorGroup)
        return cursor, created

    def cursor(self, stream: str, group: str) -> tuple[CursorGroup, StreamLog]:
        """An existing cursor group (for Pull) and its stream's log."""
        stream, group = self._names(stream, group)
        stream_log = self._log(stream)
        with self._lock:
            if self._loaded_locked(stream, group) is None and (
                    self._store.get(stream, group) is None):
                raise GroupNotFoundError(stream, group)
            cursor, _created = self._cursor_locked(stream_log, stream, group, None)
        return cursor, stream_log

    def commit(self, stream: str, group: str, next_offset: int,
               shown_offset: int) -> tuple[int, int]:
        """Set a cursor group's position, creating the group; (position, writer ticket).

        ``shown_offset`` is the value the caller sent (offset or next_offset),
        named in the error when the position lies past the stream's end.
        """
        stream, group = self._names(stream, group)
        stream_log = self._log(stream)
        start, end = stream_log.start_offset, stream_log.end_offset
        if shown_offset < 0:
            raise InvalidArgumentError(
                f"commit offset {shown_offset} for group '{group}' on stream '{stream}' "
                "must be >= 0"
            )
        if next_offset > end:
            raise OffsetOutOfRangeError(stream, shown_offset, start, end)
        with self._lock:
            found = self._loaded_locked(stream, group)
            if isinstance(found, SharedGroup):
                raise _kind_error(stream, group, "shared", "cursor")
            if found is None:
                row = self._store.get(stream, group)
                if row is None:
                    row, _ = self._store.create(stream, group, "cursor", next_offset)
                    log.info("created cursor group '%s' on stream '%s' by a commit at %d",
                             group, stream, next_offset,
                             extra=event_fields(stream=stream, group=group, offset=next_offset))
                else:
                    self._store.set_kind(stream, group, "cursor")
                found = self._load_locked(row)
            assert isinstance(found, CursorGroup)
        return found.commit(next_offset)

    # ------------------------------------------------------------ either kind

    def seek(self, stream: str, group: str,
             to: pb.StartFrom | None) -> tuple[Resolved, int]:
        """Move a group (created with kind "" when absent); (resolved target, writer ticket).

        ``to`` None (no position given) is an InvalidArgumentError.
        """
        stream, group = self._names(stream, group)
        stream_log = self._log(stream)
        target = resolve_start(stream_log, to, required=True)
        with self._lock:
            found = self._loaded_locked(stream, group)
            if found is None:
                row, created = self._store.create(stream, group, "", target.offset)
                if created:
                    log.info("created group '%s' on stream '%s' at offset %d by a seek",
                             group, stream, target.offset,
                             extra=event_fields(stream=stream, group=group,
                                                offset=target.offset))
                    return target, 0
                self._writer.flush()
                self._store.write_positions({(stream, group): (target.offset,
                                                               row.dead_lettered)})
                return target, 0
        return target, found.seek(target.offset)

    def describe(self, stream: str, group: str) -> GroupStatus:
        stream, group = self._names(stream, group)
        stream_log = self._log(stream)
        with self._lock:
            found = self._loaded_locked(stream, group)
            row = None if found is not None else self._store.get(stream, group)
        if found is None and row is None:
            raise GroupNotFoundError(stream, group)
        return self._status(stream_log, found, row)

    def _status(self, stream_log: StreamLog, found: Group | None,
                row: GroupRow | None) -> GroupStatus:
        end = stream_log.end_offset
        if isinstance(found, SharedGroup):
            snap = found.snapshot()
            return GroupStatus(found.stream, found.group, "shared", snap.committed_offset, end,
                               snap.in_flight, snap.dead_lettered, snap.members, snap.config)
        start = stream_log.start_offset
        if isinstance(found, CursorGroup):
            stored = found.position(stream_log)
            return GroupStatus(found.stream, found.group, "cursor", max(stored, start), end, 0, 0,
                               [], None, _removed_unread(stored, start))
        assert row is not None
        stored = min(row.committed_offset, end)
        return GroupStatus(row.stream, row.group, row.kind, max(stored, start), end, 0,
                           row.dead_lettered, [], row.config,
                           _removed_unread(stored, start) if row.kind != "shared" else None)

    def count(self) -> int:
        """How many groups exist, all streams together (one SQL count, nothing loaded)."""
        return self._store.count()

    def statuses(self, visible: Callable[[str], bool] | None = None,
                 limit: int | None = None) -> list[GroupStatus]:
        """Every group of every stream (``visible``: only streams it accepts), by stream, group.

        For the metrics and the web console; a stream deleted or broken
        meanwhile is skipped. ``limit``: stop after the stream that reaches it.
        """
        out: list[GroupStatus] = []
        for stream in sorted(self._store.streams()):
            if limit is not None and len(out) >= limit:
                break
            if visible is not None and not visible(stream):
                continue
            try:
                out.extend(self.list(stream))
            except BrokerError:
                continue
        return out

    def oldest_unconsumed_ms(self, status: GroupStatus) -> int:
        """Append time of the group's first unconsumed message (0: none, caught up).

        What a group's lag in seconds is measured from: its committed offset
        is the next message it has not finished.
        """
        if status.lag <= 0:
            return 0
        try:
            return self._log(status.stream).timestamp_at(status.committed_offset)
        except (BrokerError, OSError):  # deleted, broken, or retention raced the read
            return 0

    def list(self, stream: str) -> list[GroupStatus]:
        stream = check_stream_name(stream)
        stream_log = self._log(stream)
        statuses = []
        for row in self._store.list(stream):
            with self._lock:
                found = self._groups.get((row.stream, row.group))
            statuses.append(self._status(stream_log, found, row))
        return statuses

    def delete(self, stream: str, group: str) -> bool:
        stream, group = self._names(stream, group)
        if stream not in self._registry.matching(prefix=stream):
            raise StreamNotFoundError(stream)
        with self._lock:
            found = self._groups.pop((stream, group), None)
            if found is not None:
                found.close(GroupNotFoundError(stream, group))
            self._writer.discard(stream, group)
            self._writer.flush()
            deleted = self._store.delete(stream, group)
            self.metrics.forget(stream, group)
        if deleted:
            log.info("deleted group '%s' of stream '%s'", group, stream,
                     extra=event_fields(stream=stream, group=group))
        return deleted

    def on_stream_deleted(self, stream: str) -> None:
        """Listener: drop every group of a deleted stream (memory, queued writes, rows)."""
        with self._lock:
            for key in [k for k in self._groups if k[0] == stream]:
                self._groups.pop(key).close(StreamNotFoundError(stream))
            self._writer.discard(stream)
            self._writer.flush()
            count = self._store.delete_stream(stream)
            self.metrics.forget(stream)
        if count:
            log.info("dropped %d group(s) of deleted stream '%s'", count, stream)

    def release_stream(self, stream: str) -> None:
        """Listener: a stream paused for a move; its groups leave memory, positions durable.

        Calls waiting on them (Receive, Subscribe) end with STREAM_MOVING and
        their leases are dropped (delivered again, as after a restart); the
        rows stay and are copied. The stream takes no calls until the move
        ends, so nothing loads them again meanwhile.
        """
        with self._lock:
            for key in [k for k in self._groups if k[0] == stream]:
                self._groups.pop(key).close(StreamMovingError(stream, "another cluster member"))
            self._writer.flush()

    # ------------------------------------------------------------ shared groups

    def shared(self, stream: str, group: str,
               config: pb.SharedGroupConfig) -> tuple[SharedGroup, SharedConfig]:
        """The shared group, created at config.start_from when absent; (group, its config).

        The group-wide settings (max_deliver, backoff, dead-letter stream) of
        the latest caller apply; a change is stored and logged.
        """
        stream, group = self._names(stream, group)
        wanted = SharedConfig.from_pb(stream, config)
        stream_log = self._log(stream)
        with self._lock:
            found = self._loaded_locked(stream, group)
            if isinstance(found, CursorGroup):
                raise _kind_error(stream, group, "cursor", "shared")
            if found is None:
                row = self._store.get(stream, group)
                if row is None:
                    offset = resolve_start(stream_log, config.start_from).offset
                    wanted = wanted.resolved(None)
                    row, _ = self._store.create(stream, group, "shared", offset, wanted)
                    log.info("created shared group '%s' on stream '%s' at offset %d "
                             "(max_deliver=%d, backoff_ms=%s, dead_letter_stream='%s')",
                             group, stream, offset, wanted.max_deliver,
                             list(wanted.backoff_ms), wanted.dead_letter_stream,
                             extra=event_fields(stream=stream, group=group, offset=offset,
                                                dead_letter_stream=wanted.dead_letter_stream))
                else:  # kind "": positioned by a Seek
                    self._store.set_kind(stream, group, "shared", wanted)
                    row = self._store.get(stream, group)
                    assert row is not None
                found = self._load_locked(row)
            assert isinstance(found, SharedGroup)
            wanted = wanted.resolved(found.config)  # an unspecified ordering is kept
            if not found.config.same_group_settings(wanted):
                log.info("group '%s' on stream '%s': settings changed from %s to %s",
                         group, stream, found.config, wanted)
                self._store.set_kind(stream, group, "shared", wanted)
                found.update_config(wanted)
        return found, wanted

    def existing_shared(self, stream: str, group: str) -> SharedGroup:
        """A shared group that must exist already (Ack, Nack)."""
        stream, group = self._names(stream, group)
        self._log(stream)
        with self._lock:
            found = self._loaded_locked(stream, group)
        if found is None:
            raise GroupNotFoundError(stream, group)
        if isinstance(found, CursorGroup):
            raise _kind_error(stream, group, "cursor", "shared")
        return found

    # ------------------------------------------------------------ durability and upkeep

    def wait_durable(self, ticket: int) -> None:
        if ticket:
            self._writer.wait(ticket)

    def _tick_loop(self) -> None:
        while not self._stop.wait(TICK_INTERVAL_S):
            with self._lock:
                shared = [g for g in self._groups.values() if isinstance(g, SharedGroup)]
            for group in shared:
                try:
                    group.tick()
                except Exception:
                    log.exception("upkeep of group '%s' on stream '%s' failed",
                                  group.group, group.stream)

    def close(self) -> None:
        self._stop.set()
        self._ticker.join(timeout=5)
        with self._lock:
            for group in self._groups.values():
                group.close(ShuttingDownError("the broker is shutting down"))
        self._writer.close()

"""The stream registry: which streams exist and with what config (SQLite), plus their logs.

Creating a stream writes one SQLite row (rows.py) and nothing else; the log
(and its directory) is opened on first use, so ten thousand idle streams cost
ten thousand rows, not ten thousand directories or file handles. A row holds
only the config fields a user set (overrides.py).

Streams as cheap as keys (docs/scaling.md): the rows of streams
created at the same time (thousands of first publishes a second) are inserted
in one transaction by whichever creator comes first (the group commit of
storage/group_commit.py), each creator returning once its row is committed.
In memory a stream is one small slotted record (records.py) whose ``state``
says where it is in its lifecycle: CREATING while its row is queued, NURSERY
while its first message is a row (nursery.py), READY once it has a
directory, BROKEN, DELETING. Every creation goes one way (``_create``: a
CREATING record, its row through a writer, then ``_created``), and so does
a stream moved in (``load_row``). Its log is held by the storage's LRU of
open logs (``max_open_logs``), not here, so an idle stream's log state is
freed and reopened on use. Which streams a listing covers is read from
SQLite's primary-key order (listing.py).

A log that fails to open with mid-log corruption makes its stream BROKEN:
describe/list report it with ``error`` and every read or write fails with
StreamNeedsRepairError until ``repair`` truncates the log at the bad frame.

Typed streams (docs/typed-streams.md): schemas.py keeps the versions of a
stream's value schema and checks new ones; the registry keeps them in the
stream's record and hands every version to the stream's log. An untyped
stream becomes typed only while it holds no messages: the check and the new
version's row are made under the log's append lock, so no untyped append
slips in between.
"""

from __future__ import annotations

import builtins
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from npstream.broker.errors import (
    AlreadyExistsError,
    CorruptRecordError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    StreamNeedsRepairError,
    StreamNotFoundError,
)
from npstream.broker.handover import StreamStateOwner
from npstream.broker.log_events import event_fields
from npstream.broker.metadata import Metadata
from npstream.broker.storage import (
    UNTYPED,
    Storage,
    StreamConfig,
    StreamLog,
    ValueSchemas,
)
from npstream.broker.storage.files import stream_dir
from npstream.broker.storage.group_commit import GroupCommit
from npstream.broker.storage.small_append import MessageRows, lone_message
from npstream.broker.streams.disk_reserve import DiskReserve
from npstream.broker.streams.end_floors import EndFloors
from npstream.broker.streams.handover import ListingStatsOwner, StreamRowsOwner
from npstream.broker.streams.listing import StreamListing
from npstream.broker.streams.listing_stats import ListingStats
from npstream.broker.streams.names import check_stream_name
from npstream.broker.streams.nursery import Nursery
from npstream.broker.streams.overrides import ConfigOverrides
from npstream.broker.streams.records import (
    NO_EVENT,
    NO_OVERRIDES,
    NewRow,
    SchemaVersion,
    StreamRecord,
    StreamState,
    StreamStatus,
)
from npstream.broker.streams.rows import StreamRows
from npstream.broker.streams.schemas import (
    StreamSchemas,
    check_becomes_typed,
    refuse_other_schema,
)
from npstream.broker.streams.settings import StreamsSettings
from npstream.broker.streams.tuning import OPEN_LOCKS

__all__ = ["StreamRegistry"]

log = logging.getLogger(__name__)



CREATING, NURSERY, READY, BROKEN, DELETING = (
    StreamState.CREATING, StreamState.NURSERY, StreamState.READY, StreamState.BROKEN,
    StreamState.DELETING)


def _now_ms() -> int:
    return int(time.time() * 1000)


class StreamRegistry:
    """Streams by name: one record each, in its lifecycle state (records.py), over SQLite rows."""

    def __init__(
        self,
        metadata: Metadata,
        storage: Storage,
        settings: StreamsSettings,
        max_message_bytes_limit: int,
        on_stream_deleted: list[Callable[[str], None]] | None = None,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self._metadata = metadata
        self._storage = storage
        self._settings = settings
        self._defaults = settings.stream_defaults
        self._on_deleted = on_stream_deleted if on_stream_deleted is not None else []
        self._on_created: builtins.list[Callable[[builtins.list[str]], None]] = []
        self._clock = clock
        self._overrides = ConfigOverrides(self._defaults, max_message_bytes_limit)
        self._schemas = StreamSchemas(metadata, clock)
        self._nursery = Nursery(metadata)  # before the rows: they are read with its table
        self._rows = StreamRows(metadata, self._schemas)
        self._floors = EndFloors(metadata)
        self._lock = threading.Lock()  # guards the records' changes
        # Every stream's record (module docstring); a transition puts a new record.
        self._records: dict[str, StreamRecord] = self._rows.load_all()
        self._creating = 0  # CREATING records among them (not streams yet)
        # Picked by hash, re-entrant since two names may share one.
        self._open_locks = [threading.RLock() for _ in range(OPEN_LOCKS)]
        # Concurrent creators' rows: one transaction per round, led by a creator.
        self._inserts: GroupCommit[NewRow, builtins.list[NewRow]] = GroupCommit(
            self._insert_rows, list, list.append)
        # First publishes do not wait for their round (create_by_first_publish): a
        # thread writes each round, so the replies of many calls share one fsync.
        self._first_writer: GroupCommit[NewRow, builtins.list[NewRow]] = GroupCommit(
            self._insert_nursery_rows, list, list.append, lead=False,
            thread_name="nursery-writer")
        storage.add_retention_task(self._expire_nursery)
        self._reserve = DiskReserve(storage.settings.data_dir)
        self._reserve.ensure()
        storage.add_retention_task(self._keep_reserve)
        self._listing_stats = ListingStats(metadata)
        storage.set_stats_keeper(self._listing_stats)
        storage.add_retention_task(lambda _now: self._listing_stats.flush())
        # After a page: what it read from files is kept for the next one.
        self._listing = StreamListing(metadata, self.describe, self._record, self._offsets,
                                      self._listing_stats.flush)
        storage.set_value_schema_lookup(self.value_schemas_of)
        self._rows_owner = StreamRowsOwner(metadata)
        # The streams package's per-stream state, for moves (npstream.broker.handover).
        self.state_owners: tuple[StreamStateOwner, ...] = (
            self._rows_owner, ListingStatsOwner(self._listing_stats))

    # ------------------------------------------------------------ helpers

    @property
    def auto_create(self) -> bool:
        return self._settings.auto_create_streams

    def __len__(self) -> int:
        return len(self._records) - self._creating

    def __contains__(self, name: object) -> bool:
        record = self._records.get(name) if isinstance(name, str) else None
        return record is not None and record.state is not CREATING

    def state_of(self, name: str) -> StreamState | None:
        """Where ``name`` is in its lifecycle (records.py); None: no such stream."""
        record = self._records.get(name)
        return record.state if record is not None else None

    def open_logs(self) -> list[StreamLog]:
        """Snapshot of the logs open now (for metrics); broken streams' left out."""
        records = self._records
        return [stream_log for stream_log in self._storage.live_logs()
                if (record := records.get(stream_log.name)) is not None
                and record.state is READY]

    def effective_config(self, overrides: Mapping[str, int]) -> StreamConfig:
        return self._overrides.effective(overrides)

    def schema_versions(self, name: str) -> tuple[SchemaVersion, ...]:
        """The stream's value schema versions, oldest first (empty: untyped)."""
        return self._record(name).schemas

    def value_schemas_of(self, name: str) -> ValueSchemas:
        """The stream's value schemas for its log (UNTYPED when untyped or unknown)."""
        record = self._records.get(name)
        return record.value_schemas() if record is not None else UNTYPED

    def _record(self, name: str) -> StreamRecord:
        record = self._records.get(check_stream_name(name))
        if record is None or record.state is CREATING:
            raise StreamNotFoundError(name)
        return record

    def _move(self, name: str, state: StreamState, detail: object = None, *,
              when: tuple[StreamState, ...]) -> StreamRecord | None:
        """Put ``name``'s record in ``state`` when it is in one of ``when``; the new record."""
        with self._lock:
            record = self._records.get(name)
            if record is None or record.state not in when:
                return None
            moved = self._records[name] = record.moved_to(state, detail)
            return moved

    def _open_lock(self, name: str) -> threading.RLock:
        return self._open_locks[hash(name) % OPEN_LOCKS]

    def _open(self, name: str) -> StreamLog:
        """The stream's log, opening it on first use; StreamNeedsRepairError if broken."""
        record = self._records.get(name)
        if record is not None and record.state is READY:
            stream_log = self._storage.live_log(name)  # marked recently used: the LRU keeps it
            if stream_log is not None:
                return stream_log
        with self._open_lock(name):
            record = self._record(name)
            if record.state is BROKEN:
                raise StreamNeedsRepairError(name, record.detail)
            if record.state is DELETING:
                raise StreamNotFoundError(name)
            floor = 0
            if record.state is NURSERY:
                self._write_out_locked(name)
            else:
                floor = self._floors.get(name)
            if floor and not self._storage.has_directory(name):
                raise self._refuse(name, CorruptRecordError(
                    stream_dir(self._storage.settings.data_dir, name), 0,
                    f"the stream directory is missing, but the registry ({self._metadata.path}) "
                    f"records offsets up to {floor}: acknowledged messages are missing, and "
                    f"opening the log would reuse their offsets (repair restarts the stream "
                    f"empty at offset {floor})", short=True))
            try:
                stream_log = self._storage.open_log(
                    name, self.effective_config(record.overrides), record.value_schemas())
            except CorruptRecordError as exc:
                raise self._refuse(name, exc) from None
            if stream_log.end_offset < floor:
                self._storage.close_log(name)
                raise self._refuse(name, CorruptRecordError(
                    stream_dir(self._storage.settings.data_dir, name), 0,
                    f"the log ends at offset {stream_log.end_offset}, but the registry "
                    f"({self._metadata.path}) records offsets up to {floor}: acknowledged "
                    f"messages are missing, and opening the log would reuse their offsets",
                    short=True))
            return stream_log

    def _refuse(self, name: str, exc: CorruptRecordError) -> StreamNeedsRepairError:
        """Mark ``name`` broken (one ERROR line) and the error its caller raises."""
        self.mark_broken(name, exc)
        return StreamNeedsRepairError(name, exc)

    def end_floors(self) -> builtins.list[tuple[str, int]]:
        """(name, recorded end floor) of every stream with one (consistency.py)."""
        return self._floors.recorded()

    def record_end_floors(self, ends: Mapping[str, int]) -> None:
        """Record these streams' ends as reached (end_floors.py); at a clean stop."""
        self._floors.raise_to({name: end for name, end in ends.items() if name in self._records})

    def _write_out_locked(self, name: str) -> None:
        """Give a nursery stream its directory before its log opens (nursery.py): READY.

        The caller holds the name's open lock. The frame is durable in its
        segment before the row goes, so a crash in between finds both and
        writes nothing twice (first_frame.py).
        """
        record = self._records.get(name)
        if record is None or record.state is not NURSERY:
            return
        frame = self._nursery.frame_of(name)
        if frame is not None:
            self._storage.write_first_frame(name, self.effective_config(record.overrides), frame)
            self._nursery.forget(name)
        self._move(name, READY, when=(NURSERY,))

    def _write_out(self, name: str) -> None:
        """``_write_out_locked`` under the name's open lock (update, repair, expiry)."""
        with self._open_lock(name):
            self._write_out_locked(name)

    def _keep_reserve(self, _now: int) -> None:
        """A retention pass: make the disk reserve again once there is room (disk_reserve.py)."""
        self._reserve.ensure()

    def _expire_nursery(self, now: int) -> None:
        """A retention pass: write out nursery streams whose message may have expired."""
        max_age = self._defaults.max_age_ms
        if max_age:
            for name in self._nursery.sweep_older_than(now - max_age):
                self._write_out(name)

    def mark_broken(self, name: str, exc: CorruptRecordError) -> None:
        """Refuse reads and writes of this stream until it is repaired."""
        if self._move(name, BROKEN, exc, when=(READY,)) is not None:
            log.error("stream '%s' needs repair: %s", name, exc)

    # ------------------------------------------------------------ operations

    def get(self, name: str, *, create_if_missing: bool = False) -> StreamLog:
        """The stream's log; creates the stream first when asked and auto_create_streams is on."""
        record = self._records.get(name)
        if record is not None and record.state is READY:
            stream_log = self._storage.live_log(name)
            if stream_log is not None:
                return stream_log
        name = check_stream_name(name)
        if name not in self:
            if not (create_if_missing and self.auto_create):
                raise StreamNotFoundError(name)
            if self._create(name, NO_OVERRIDES, None) is None:
                log.info("created stream '%s' on first publish", name,
                         extra=event_fields(stream=name))
        return self._open(name)

    def create_by_first_publish(self, name: str, rows: MessageRows,
                                ) -> tuple[int, Callable[[], None]] | None:
        """Create ``name`` in the nursery with ``rows`` as its first message, without waiting.

        Only when ``name`` is new, auto-creation is on, ``rows`` is one plain
        message (small_append.lone_message) and the LRU of open logs is full (a
        broker with many streams: the new log would push another out; while it
        has room the stream is opened at once, and stays in the per-stream
        metrics); None otherwise (the caller takes the usual path). Returns the
        message's timestamp and a ``wait`` that returns once the stream and its
        message are durable (raises if they could not be stored). The name is a
        stream for every other caller only after that.
        """
        if not self.auto_create or name in self._records or not self._storage.logs_full():
            return None
        try:
            lone = lone_message(rows, name, self._defaults.max_message_bytes)
        except MessageTooLargeError:
            return None  # the usual path creates the stream, then refuses the message
        if lone is None:
            return None
        frame, timestamp = self._storage.first_frame(lone.value)
        row = NewRow(StreamRecord(name, NO_OVERRIDES, self._clock(), (), NURSERY), "{}", None,
                     NO_EVENT, frame, timestamp)
        with self._lock:  # the writer's round reaches the records through this lock too
            if self._begin_locked(row) is not row:
                return None  # created, or being created, meanwhile
            written = self._first_writer.submit(row)
            # What a concurrent get() of the name waits for.
            row.done = self._first_writer.done_event(written)
        return timestamp, self._first_writer.waiter(written)

    def _create(self, name: str, overrides: Mapping[str, int],
                schema: SchemaVersion | None) -> StreamRecord | None:
        """Create the stream (its row); None when created here, else the existing record.

        The one way a stream is created (a first publish into the nursery
        joins it at ``_begin_locked``): a CREATING record, the row through a
        writer, then ``_created``. Concurrent creators of different streams
        share one transaction (the group insert); a creator of a name already
        queued waits for that row. Returns once the row is committed
        (durable as metadata_sync says).
        """
        row = NewRow(StreamRecord(name, overrides or NO_OVERRIDES, self._clock(),
                                  (schema,) if schema is not None else ()),
                     json.dumps(overrides, sort_keys=True), schema)
        with self._lock:
            found = self._begin_locked(row)
        if isinstance(found, StreamRecord):
            return found
        if found is not row:  # another call creates it: wait for its row, then it exists
            found.done.wait()
            with self._lock:
                existing = self._records.get(name)
            if existing is None or existing.state is CREATING:
                raise StreamNotFoundError(name)  # that create failed
            return existing
        try:
            self._inserts.commit(row)
        except BaseException:
            self._created([row], ok=False)
            raise
        finally:
            row.done.set()
        return None

    def _begin_locked(self, row: NewRow) -> StreamRecord | NewRow:
        """Under ``_lock``: the existing stream's record, the row another creator queued for
        the name, or ``row`` itself, its stream now CREATING (the caller writes it)."""
        name = row.record.name
        current = self._records.get(name)
        if current is None:
            self._records[name] = row.record.moved_to(CREATING, row)
            self._creating += 1
            return row
        if current.state is CREATING:
            queued: NewRow = current.detail
            return queued
        return current

    def _created(self, rows: Iterable[NewRow], *, ok: bool) -> None:
        """The rows' transaction committed (``ok``: their streams exist) or failed (gone)."""
        with self._lock:
            for row in rows:
                name = row.record.name
                current = self._records.get(name)
                if current is None or current.state is not CREATING or current.detail is not row:
                    continue  # taken up otherwise meanwhile (load_row)
                self._creating -= 1
                if ok:
                    self._records[name] = row.record
                else:
                    del self._records[name]

    def _insert_nursery_rows(self, rows: Sequence[NewRow]) -> None:
        """The nursery writer: one fsynced transaction for the streams and their first frames.

        Raises when the transaction failed (the writer fails the round's waiters).
        """
        error: BaseException | None = None
        try:
            with self._metadata.durable_transaction():
                self._rows.insert(rows)
                self._nursery.insert((row.record.name, row.frame, 1, row.timestamp_ms)
                                     for row in rows)
        except BaseException as exc:
            error = exc
        self._created(rows, ok=error is None)
        if error is not None:
            log.error("creating %d stream(s) on first publish failed: %s", len(rows), error)
            raise error
        for row in rows:  # the same event as the usual path's, after the commit
            log.info("created stream '%s' on first publish", row.record.name,
                     extra=event_fields(stream=row.record.name))
        self._tell_created([row.record.name for row in rows])

    def _insert_rows(self, rows: builtins.list[NewRow]) -> None:
        """Group-commit flush: every queued row in one transaction, then in memory."""
        self._rows.insert(rows)
        self._created(rows, ok=True)
        self._tell_created([row.record.name for row in rows])

    def add_created_listener(self, listener: Callable[[builtins.list[str]], None]) -> None:
        """``listener(names)`` after each commit of new streams, before their creators
        hear of it (a cluster member records them in etcd: npstream.broker.cluster)."""
        self._on_created.append(listener)

    def _tell_created(self, names: builtins.list[str]) -> None:
        for listener in list(self._on_created):
            try:
                listener(names)
            except Exception:
                log.exception("stream-created listener %r failed for %d stream(s)", listener,
                              len(names))

    def create(
        self, name: str, overrides: Mapping[str, int], *, exist_ok: bool = False,
        value_schema: str = "",
    ) -> tuple[StreamStatus, bool]:
        """(status, created). Same effective config and schema as an existing stream: not an error.

        ``value_schema`` (DDL or JSON) makes a typed stream, schema version 1.
        """
        name = check_stream_name(name)
        overrides = self._overrides.check(name, overrides)
        schema = self._schemas.new_version(name, value_schema, 1) if value_schema else None
        existing = self._create(name, overrides, schema)
        if existing is not None:
            wanted = self.effective_config(overrides)
            have = self.effective_config(existing.overrides)
            if wanted != have and not exist_ok:
                raise AlreadyExistsError(
                    f"stream '{name}' already exists with a different config: "
                    f"existing {have}, requested {wanted}; pass exist_ok to keep the existing one"
                )
            if not exist_ok:
                refuse_other_schema(name, existing.schemas, schema)
            return self.describe(name), False
        log.info("created stream '%s' config=%s%s", name, self.effective_config(overrides),
                 f" value schema '{schema.ddl}'" if schema else "",
                 extra=event_fields(stream=name))
        return self.describe(name), True

    def describe(self, name: str) -> StreamStatus:
        record = self._record(name)
        config = self.effective_config(record.overrides)
        try:
            if record.state is BROKEN:
                raise StreamNeedsRepairError(record.name, record.detail)
            stats = ((record.state is NURSERY and self._nursery.stats_of(record.name))
                     or self._storage.peek_stats(record.name))  # a listing opens nothing
            if stats is None:
                stats = self._open(record.name).stats()
        except StreamNeedsRepairError as exc:
            return StreamStatus(record.name, config, record.created_ms, None, str(exc),
                                record.schemas)
        record = self._records.get(record.name, record)  # a schema added meanwhile
        return StreamStatus(record.name, config, record.created_ms, stats,
                            schemas=record.schemas)

    # builtins.list: in the class body `list` is the method below.
    def matching(self, prefix: str = "", pattern: str = "", after: str = "",
                 limit: int = 0, visible: Callable[[str], bool] | None = None,
                 ) -> builtins.list[str]:
        """Sorted names with the prefix, matching the glob, after a name (listing.py)."""
        return self._listing.matching(prefix, pattern, after, limit, visible)

    def list(
        self, prefix: str = "", pattern: str = "", page_size: int = 0, page_token: str = "",
        visible: Callable[[str], bool] | None = None,
    ) -> tuple[list[StreamStatus], str]:
        """One page of streams and the token of the next page ("" at the end; listing.py)."""
        return self._listing.page(prefix, pattern, page_size, page_token, visible)

    def update(self, name: str, overrides: Mapping[str, int],
               value_schema: str = "") -> StreamStatus:
        """Change only the given fields; the log picks the new config up at once.

        ``value_schema`` (DDL or JSON): the stream's new value schema, applied
        first; when it is refused nothing of the update is applied. On a full
        disk it runs in the disk reserve's room (disk_reserve.py): lowering
        retention is how space is freed.
        """
        return self._reserve.freeing(name, "update_stream",
                                     lambda: self._update(name, overrides, value_schema))

    def _update(self, name: str, overrides: Mapping[str, int],
                value_schema: str) -> StreamStatus:
        record = self._record(name)
        changes = self._overrides.check(record.name, overrides)
        self._write_out(record.name)  # nursery streams follow the defaults only
        if value_schema:
            self._change_schema(record.name, value_schema)
        if not changes and value_schema:
            return self.describe(record.name)
        with self._open_lock(record.name):
            with self._lock:
                current = self._records.get(record.name)
                if current is None or current.state is DELETING:
                    raise StreamNotFoundError(record.name)
                merged = {**current.overrides, **changes}
                self._rows.set_overrides(record.name, merged)
                self._records[record.name] = current._replace(overrides=merged)
            stream_log = self._storage.live_log(record.name)
            if stream_log is not None:
                stream_log.update_config(self.effective_config(merged))
        log.info("updated stream '%s' config=%s", record.name, self.effective_config(merged),
                 extra=event_fields(stream=record.name))
        return self.describe(record.name)

    def _change_schema(self, name: str, text: str) -> None:
        """Make ``text`` the stream's value schema: a new version, or nothing when identical.

        SchemaInvalidError when it does not parse; SchemaIncompatibleError when
        the evolution rules refuse it, or when an untyped stream that holds
        messages would become typed.
        """
        stream_log = self._open(name)  # the emptiness check needs the log
        with self._open_lock(name):
            record = self._records.get(name)
            if record is None:
                raise StreamNotFoundError(name)
            entry = self._schemas.evolve(name, record.schemas, text)
            if entry is None:
                return  # identical: no new version
            schemas = record.value_schemas().with_version(entry.version, entry.schema)

            def record_change(start: int, end: int) -> None:  # under the log's append lock
                if not record.schemas:
                    check_becomes_typed(name, start, end)
                with self._lock:
                    current = self._records.get(name)
                    if current is None or current.schemas is not record.schemas:
                        raise StreamNotFoundError(name)  # deleted (or changed) meanwhile
                    self._schemas.insert(name, entry)
                    self._records[name] = current._replace(schemas=(*record.schemas, entry))

            if self._storage.live_log(name) is not stream_log:
                raise StreamNotFoundError(name)
            stream_log.set_value_schemas(schemas, record_change)
        log.info("stream '%s': value schema version %d '%s'%s", name, entry.version, entry.ddl,
                 " (the stream is typed now)" if not record.schemas else "")

    def close_log(self, name: str) -> None:
        """Flush and close the stream's log (files stay; the next use opens it again).

        A stream paused for a move is closed so that its files are complete
        and still while they are copied (npstream.broker.cluster.move).
        """
        with self._open_lock(name):
            live = self._storage.live_log(name)
            self._storage.close_log(name)
            if live is not None:
                self._floors.raise_to({name: live.end_offset})

    def load_row(self, name: str) -> None:
        """Take up the rows another module wrote for ``name`` (a stream moved in).

        A stream moved in from another member is installed by writing its rows
        (with its groups and sink floors) in one transaction (cluster/move_in.py);
        this makes the registry serve it: READY, or NURSERY with a nursery row.
        """
        record = self._rows.load(name)
        if record is not None:
            with self._lock:
                current = self._records.get(name)
                if current is not None and current.state is CREATING:
                    self._creating -= 1  # its creator's row fails: the name is taken
                self._records[name] = record

    def delete(self, name: str) -> bool:
        """Drop the files, then the row, then tell listeners; False if there was no stream."""
        name = check_stream_name(name)
        with self._open_lock(name):
            with self._lock:
                before = self._records.get(name)
                if before is None or before.state in (CREATING, DELETING):
                    return False
                self._records[name] = before.moved_to(DELETING)
            try:
                self._storage.close_log(name)
                # Files before the row: a crash in between leaves an empty stream, never a
                # new stream that inherits old data (its end floor goes first: not refused).
                self._zero_floor(name)
                self._storage.drop_log(name)
                with self._lock, self._metadata.transaction() as txn:
                    self._rows_owner.drop(name, txn)
                    del self._records[name]
            except BaseException:
                with self._lock:
                    self._records[name] = before  # still a stream, as it was
                raise
        log.info("deleted stream '%s'", name, extra=event_fields(stream=name))
        for listener in list(self._on_deleted):
            try:
                listener(name)
            except Exception:
                log.exception("stream-deleted listener %r failed for '%s'", listener, name)
        return True

    def _zero_floor(self, name: str) -> None:
        """Zero the end floor before the files go; on a full disk SQLite may refuse the
        write: the delete goes on (a crash before the row goes then leaves the stream
        refused, and deleting it again finishes)."""
        try:
            self._floors.set(name, 0)
        except sqlite3.Error as exc:
            log.warning("stream '%s': could not clear its recorded end offset before deleting "
                        "its files (%s)", name, exc)

    def delete_messages(self, name: str, before_offset: int | None) -> StreamStatus:
        """Move start_offset: to before_offset (exclusive), or to end_offset when None.

        On a full disk it runs in the disk reserve's room (disk_reserve.py).
        """
        return self._reserve.freeing(name, "delete_messages",
                                     lambda: self._delete_messages(name, before_offset))

    def _delete_messages(self, name: str, before_offset: int | None) -> StreamStatus:
        stream_log = self.get(name)
        if before_offset is None:
            stream_log.delete_all()
            log.info("deleted all messages of stream '%s' (start_offset=%d)",
                     name, stream_log.end_offset,
                     extra=event_fields(stream=name, start_offset=stream_log.end_offset))
            return self.describe(name)
        start, end = stream_log.start_offset, stream_log.end_offset
        if before_offset < 0 or before_offset > end:
            raise OffsetOutOfRangeError(name, before_offset, start, end)
        if before_offset > start:
            stream_log.delete_before(before_offset)
            log.info("deleted messages of stream '%s' before offset %d (was start_offset=%d)",
                     name, before_offset, start,
                     extra=event_fields(stream=name, start_offset=before_offset))
        return self.describe(name)

    def repair(self, name: str) -> tuple[StreamStatus, int, str]:
        """Truncate the log at its first bad frame and reopen it: (status, bytes cut, where)."""
        record = self._record(name)
        self._write_out(record.name)
        with self._open_lock(record.name):
            self._move(record.name, READY, when=(BROKEN,))
            config, schemas = self.effective_config(record.overrides), record.value_schemas()
            floor = self._floors.get(record.name)
            if floor and not self._storage.has_directory(record.name):
                self._storage.restart_missing_log(record.name, floor, config, schemas)
                log.warning("repaired stream '%s': its directory %s was missing; it restarts "
                            "empty at offset %d (offsets below it are lost and never assigned "
                            "again)", record.name,
                            stream_dir(self._storage.settings.data_dir, record.name), floor)
                return self.describe(record.name), 0, ""
            truncated, detail = self._storage.repair_log(record.name, config, schemas)
            end = self._storage.open_log(record.name, config, schemas).end_offset
            if end < floor:
                log.warning("repaired stream '%s': accepted a log that ends at offset %d, below "
                            "the end offset %d the registry recorded; offsets from %d on are "
                            "assigned again", record.name, end, floor, end)
                self._floors.set(record.name, end)
        if truncated:
            log.warning("repaired stream '%s': cut %d bytes at %s", record.name, truncated, detail)
        else:
            log.info("repair of stream '%s' found nothing to cut", record.name)
        return self.describe(record.name), truncated, detail

    # builtins.list: in the class body `list` is the method above.
    def end_offsets(self, names: Iterable[str], pattern: str = "",
                    visible: Callable[[str], bool] | None = None,
                    ) -> builtins.list[tuple[str, int, int]]:
        """(name, start, end offsets) of the named streams and the pattern's (listing.py)."""
        return self._listing.end_offsets(names, pattern, visible)

    def _offsets(self, name: str) -> tuple[int, int]:
        """(start_offset, end_offset), from the nursery's row while there is one (no log)."""
        record = self._records.get(name)
        kept = (self._nursery.stats_of(name) if record is not None and record.state is NURSERY
                else None)
        if kept is not None:
            return kept.start_offset, kept.end_offset
        stream_log = self._open(name)
        return stream_log.start_offset, stream_log.end_offset

"""The stream registry: which streams exist and with what config (SQLite), plus their logs.

Creating a stream writes one SQLite row and nothing else; the log (and its
directory) is opened on first use, so ten thousand idle streams cost ten
thousand rows, not ten thousand directories or file handles. Only the fields
a user set explicitly are stored; the rest follow the broker-wide defaults,
so changing a default in broker.toml applies to every stream that never
overrode it.

A log that fails to open with mid-log corruption is remembered as broken:
describe/list report it with ``error`` and every read or write fails with
StreamNeedsRepairError until ``repair`` truncates the log at the bad frame.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import dataclasses
import fnmatch
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from npstream.broker.errors import (
    AlreadyExistsError,
    CorruptRecordError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    StreamNeedsRepairError,
    StreamNotFoundError,
)
from npstream.broker.metadata import Metadata
from npstream.broker.server.config import BrokerConfig
from npstream.broker.storage import LogStats, Storage, StreamConfig, StreamLog
from npstream.proto.defaults import DEFAULT_LIST_PAGE_SIZE, MAX_LIST_PAGE_SIZE
from npstream.proto.names import validate_stream_name
from npstream.proto.stream_config import STREAM_CONFIG_FIELDS

__all__ = ["StreamRegistry", "StreamStatus", "check_stream_name"]

log = logging.getLogger(__name__)



def check_stream_name(name: object) -> str:
    """The name, or InvalidArgumentError stating the naming rule."""
    try:
        return validate_stream_name(name)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None


@dataclass(frozen=True)
class StreamStatus:
    """What DescribeStream reports; ``stats`` is None when the log needs repair."""

    name: str
    config: StreamConfig
    created_ms: int
    stats: LogStats | None
    error: str = ""


@dataclass(frozen=True)
class _Record:
    name: str
    overrides: Mapping[str, int]
    created_ms: int


def _now_ms() -> int:
    return int(time.time() * 1000)


class StreamRegistry:
    """Streams by name: metadata rows, lazily opened logs, and the broken ones."""

    def __init__(
        self,
        metadata: Metadata,
        storage: Storage,
        config: BrokerConfig,
        on_stream_deleted: list[Callable[[str], None]] | None = None,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self._metadata = metadata
        self._storage = storage
        self._config = config
        self._defaults = config.streams.stream_defaults
        self._on_deleted = on_stream_deleted if on_stream_deleted is not None else []
        self._clock = clock
        self._lock = threading.Lock()  # guards the three dicts below
        self._records: dict[str, _Record] = {}
        self._logs: dict[str, StreamLog] = {}
        self._broken: dict[str, CorruptRecordError] = {}
        self._open_locks: dict[str, threading.Lock] = {}
        for row in metadata.execute("SELECT name, config_json, created_ms FROM streams"):
            overrides = {k: int(v) for k, v in json.loads(row["config_json"]).items()}
            self._records[row["name"]] = _Record(row["name"], overrides, row["created_ms"])

    # ------------------------------------------------------------ helpers

    @property
    def auto_create(self) -> bool:
        return self._config.streams.auto_create_streams

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, name: object) -> bool:
        return name in self._records

    def open_logs(self) -> list[StreamLog]:
        """Snapshot of the logs opened so far (for metrics)."""
        with self._lock:
            return list(self._logs.values())

    def effective_config(self, overrides: Mapping[str, int]) -> StreamConfig:
        own = {f: int(overrides[f]) for f in STREAM_CONFIG_FIELDS if f in overrides}
        return dataclasses.replace(self._defaults, **own)

    def _check_overrides(self, name: str, overrides: Mapping[str, int]) -> dict[str, int]:
        checked: dict[str, int] = {}
        server = self._config.server
        for field, value in overrides.items():
            if field not in STREAM_CONFIG_FIELDS:
                raise InvalidArgumentError(f"unknown stream config field '{field}'")
            if value < 0:
                raise InvalidArgumentError(
                    f"{field}={value} for stream '{name}' must be >= 0"
                )
            if field == "max_message_bytes" and not server.allows_max_message_bytes(value):
                raise InvalidArgumentError(
                    f"max_message_bytes={value} for stream '{name}' must be within "
                    f"1..{server.max_message_bytes_limit} "
                    "(half of the broker's grpc_max_message_bytes)"
                )
            checked[field] = int(value)
        return checked

    def _record(self, name: str) -> _Record:
        record = self._records.get(check_stream_name(name))
        if record is None:
            raise StreamNotFoundError(name)
        return record

    def _open_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._open_locks.setdefault(name, threading.Lock())

    def _open(self, name: str) -> StreamLog:
        """The stream's log, opening it on first use; StreamNeedsRepairError if broken."""
        stream_log = self._logs.get(name)
        if stream_log is not None:
            return stream_log
        with self._open_lock(name):
            stream_log = self._logs.get(name)
            if stream_log is not None:
                return stream_log
            broken = self._broken.get(name)
            if broken is not None:
                raise StreamNeedsRepairError(name, broken)
            record = self._record(name)
            try:
                stream_log = self._storage.open_log(name, self.effective_config(record.overrides))
            except CorruptRecordError as exc:
                self.mark_broken(name, exc)
                raise StreamNeedsRepairError(name, exc) from None
            with self._lock:
                self._logs[name] = stream_log
            return stream_log

    def mark_broken(self, name: str, exc: CorruptRecordError) -> None:
        """Refuse reads and writes of this stream until it is repaired."""
        with self._lock:
            self._logs.pop(name, None)
            self._broken[name] = exc
        log.error("stream '%s' needs repair: %s", name, exc)

    # ------------------------------------------------------------ operations

    def get(self, name: str, *, create_if_missing: bool = False) -> StreamLog:
        """The stream's log; creates the stream first when asked and auto_create_streams is on."""
        stream_log = self._logs.get(name)
        if stream_log is not None:
            return stream_log
        name = check_stream_name(name)
        if name not in self._records:
            if not (create_if_missing and self.auto_create):
                raise StreamNotFoundError(name)
            self.create(name, {}, exist_ok=True)
        return self._open(name)

    def create(
        self, name: str, overrides: Mapping[str, int], *, exist_ok: bool = False
    ) -> tuple[StreamStatus, bool]:
        """(status, created). Same effective config as an existing stream: not an error."""
        name = check_stream_name(name)
        overrides = self._check_overrides(name, overrides)
        with self._lock:
            existing = self._records.get(name)
            if existing is None:
                record = _Record(name, overrides, self._clock())
                self._metadata.execute(
                    "INSERT INTO streams (name, config_json, created_ms) VALUES (?, ?, ?)",
                    (name, json.dumps(overrides, sort_keys=True), record.created_ms),
                )
                self._records[name] = record
        if existing is not None:
            wanted = self.effective_config(overrides)
            have = self.effective_config(existing.overrides)
            if wanted != have and not exist_ok:
                raise AlreadyExistsError(
                    f"stream '{name}' already exists with a different config: "
                    f"existing {have}, requested {wanted}; pass exist_ok to keep the existing one"
                )
            return self.describe(name), False
        log.info("created stream '%s' config=%s", name, self.effective_config(overrides))
        return self.describe(name), True

    def describe(self, name: str) -> StreamStatus:
        record = self._record(name)
        config = self.effective_config(record.overrides)
        try:
            stats = self._open(record.name).stats()
        except StreamNeedsRepairError as exc:
            return StreamStatus(record.name, config, record.created_ms, None, str(exc))
        return StreamStatus(record.name, config, record.created_ms, stats)

    def matching(self, prefix: str = "", pattern: str = "", after: str = "") -> list[str]:
        """Sorted names with the prefix, matching the glob (case-sensitive), after a name."""
        with self._lock:
            names = list(self._records)
        return sorted(
            n for n in names
            if n > after and n.startswith(prefix)
            and (not pattern or fnmatch.fnmatchcase(n, pattern))
        )

    def list(
        self, prefix: str = "", pattern: str = "", page_size: int = 0, page_token: str = ""
    ) -> tuple[list[StreamStatus], str]:
        """One page of streams in name order and the token of the next page ("" at the end)."""
        if page_size < 0:
            raise InvalidArgumentError(f"page_size={page_size} must be >= 0")
        size = min(page_size or DEFAULT_LIST_PAGE_SIZE, MAX_LIST_PAGE_SIZE)
        after = ""
        if page_token:
            try:
                after = base64.b64decode(page_token.encode(), altchars=b"-_",
                                         validate=True).decode()
            except (binascii.Error, UnicodeDecodeError, ValueError):
                raise InvalidArgumentError(f"invalid page_token {page_token!r}") from None
        names = self.matching(prefix, pattern, after)
        page = names[:size]
        statuses: list[StreamStatus] = []
        for name in page:
            try:
                statuses.append(self.describe(name))
            except StreamNotFoundError:  # deleted while listing
                continue
        token = base64.urlsafe_b64encode(page[-1].encode()).decode() if len(names) > size else ""
        return statuses, token

    def update(self, name: str, overrides: Mapping[str, int]) -> StreamStatus:
        """Change only the given fields; the log picks the new config up at once."""
        record = self._record(name)
        changes = self._check_overrides(record.name, overrides)
        with self._open_lock(record.name):
            merged = {**record.overrides, **changes}
            with self._lock:
                if record.name not in self._records:
                    raise StreamNotFoundError(record.name)
                self._metadata.execute(
                    "UPDATE streams SET config_json = ? WHERE name = ?",
                    (json.dumps(merged, sort_keys=True), record.name),
                )
                self._records[record.name] = _Record(record.name, merged, record.created_ms)
                stream_log = self._logs.get(record.name)
            if stream_log is not None:
                stream_log.update_config(self.effective_config(merged))
        log.info("updated stream '%s' config=%s", record.name, self.effective_config(merged))
        return self.describe(record.name)

    def delete(self, name: str) -> bool:
        """Drop the files, then the row, then tell listeners; False if there was no stream."""
        name = check_stream_name(name)
        with self._open_lock(name):
            with self._lock:
                if name not in self._records:
                    return False
                was_open = self._logs.pop(name, None) is not None
                self._broken.pop(name, None)
            if was_open:
                self._storage.close_log(name)
            # Files before the row: a crash in between leaves an empty stream, never a
            # new stream that inherits old data.
            self._storage.drop_log(name)
            with self._lock:
                self._metadata.execute("DELETE FROM streams WHERE name = ?", (name,))
                self._records.pop(name, None)
        log.info("deleted stream '%s'", name)
        for listener in list(self._on_deleted):
            try:
                listener(name)
            except Exception:
                log.exception("stream-deleted listener %r failed for '%s'", listener, name)
        return True

    def delete_messages(self, name: str, before_offset: int | None) -> StreamStatus:
        """Move start_offset: to before_offset (exclusive), or to end_offset when None."""
        stream_log = self.get(name)
        if before_offset is None:
            stream_log.delete_all()
            log.info("deleted all messages of stream '%s' (start_offset=%d)",
                     name, stream_log.end_offset)
            return self.describe(name)
        start, end = stream_log.start_offset, stream_log.end_offset
        if before_offset < 0 or before_offset > end:
            raise OffsetOutOfRangeError(name, before_offset, start, end)
        if before_offset > start:
            stream_log.delete_before(before_offset)
            log.info("deleted messages of stream '%s' before offset %d (was start_offset=%d)",
                     name, before_offset, start)
        return self.describe(name)

    def repair(self, name: str) -> tuple[StreamStatus, int, str]:
        """Truncate the log at its first bad frame and reopen it: (status, bytes cut, where)."""
        record = self._record(name)
        with self._open_lock(record.name):
            with self._lock:
                was_open = self._logs.pop(record.name, None) is not None
                self._broken.pop(record.name, None)
            if was_open:
                self._storage.close_log(record.name)
            truncated, detail = self._storage.repair_log(
                record.name, self.effective_config(record.overrides)
            )
        if truncated:
            log.warning("repaired stream '%s': cut %d bytes at %s", record.name, truncated, detail)
        else:
            log.info("repair of stream '%s' found nothing to cut", record.name)
        return self.describe(record.name), truncated, detail

    # builtins.list: in the class body `list` is the method above.
    def end_offsets(self, names: Iterable[str],
                    pattern: str = "") -> builtins.list[tuple[str, int, int]]:
        """(name, start_offset, end_offset) for the named streams plus those matching pattern."""
        wanted: dict[str, None] = {}
        for name in names:
            self._record(name)
            wanted[name] = None
        if pattern:
            wanted.update(dict.fromkeys(self.matching(pattern=pattern)))
        result: list[tuple[str, int, int]] = []
        for name in wanted:
            try:
                stream_log = self._open(name)
            except StreamNotFoundError:  # deleted meanwhile; only named ones are errors
                continue
            result.append((name, stream_log.start_offset, stream_log.end_offset))
        return result

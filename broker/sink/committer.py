"""Atomic sink commits: markers, roll-forward recovery and staging garbage collection.

The promise: once CommitBatch(sink_id, batch_id, staging_ids) has replied, the
rows of exactly the listed stagings are in their target streams exactly once,
contiguous per stream, and (sink_id, batch_id) is recorded so that a replay of
that commit appends nothing. A broker crash at any point of a commit is
repaired at the next start, before anything is served, by finishing it (roll
forward): staged data is durable, so the commit never has to be undone.

State in SQLite (through ``ctx.metadata``):

``sink_state``    one row per sink: the last committed batch id.
``sink_pending``  the commit in progress of a sink: its batch, the staging ids
                  listed by the driver and the target streams. Recorded
                  (durably) before the first byte is appended, deleted in the
                  same transaction that records the batch as committed.
``sink_markers``  one row per (commit, stream): ``first_offset`` and
                  ``row_count`` of the rows being appended, ``state``
                  'committing' while the append may be incomplete, 'done' once
                  it returned (fsynced).

Per stream, ``StreamLog.append_prebuilt`` (``append_atomic`` for staging files
of the oldest format) records the 'committing' marker, with the append's
first offset and timestamp, from its ``before_write`` callback, under the
log's append lock, before any byte is written; nothing else can append to
the stream until the sink's rows are written and fsynced. Large staged files
of one stream are adopted (stamped in place and renamed into the stream as a
segment, storage/staged_segment.py), the others copied. So when recovery
finds a 'committing' marker:

* ``end_offset >= first_offset + row_count``: the append completed (later
  offsets, if any, are other writers' data appended after it); mark it done.
* otherwise the crash interrupted it. Each staging's rows start at a known
  offset (the first offset plus the rows of the stagings listed before it)
  and every offset from ``first_offset`` on belongs to the append, so the log
  is cut back to the start of the staging it ends in (an adopted staging is
  whole or absent: only a copied one can be torn) and the append goes on from
  that staging with the marker's timestamp: the same rows with the same ids
  at the same offsets (ids missing at Stage were filled there, see
  sink_frames). Adopted files cannot be written again (they moved), which is
  why the append resumes rather than starting over.

An append that fails on a disk error (fsync, or undoing a partial write)
leaves the log refusing writes until the broker restarts, with the rows
possibly in its files: the marker stays 'committing' and the restart settles
it as above. Any other failure wrote nothing, and the marker is deleted.

Markers and the pending row must be durable before the log bytes they
describe. With ``metadata_sync = "normal"`` SQLite does not fsync its WAL on
commit (a process crash keeps it, a power loss may not), so the sink forces a
WAL checkpoint (which syncs the WAL) after each marker; with "full" every
commit is synced already.

Test-only fault hook: the environment variable ``NPSTREAM_SINK_FAULT`` makes
the broker ``os._exit(FAULT_EXIT_CODE)`` in the middle of the first commit:

* ``marker``  after the 'committing' marker is durable, before any byte;
* ``append``  after the stream's append returned, before the marker becomes 'done';
* ``torn:N``  like ``append``, but first cuts the stream's newest segment file
  back to its size before the commit plus N bytes, as if the broker had died
  after writing N bytes of the commit;
* ``done:K``  after K streams of the commit are done (partial multi-stream
  commit);
* ``stamped:K`` after the K-th staged file adopted by this broker process is
  stamped and fsynced (every file of an append is stamped before the first
  is renamed);
* ``renaming:K`` right before the K-th staged file is renamed into its
  stream, after everything before it in the append was written;
* ``adopted:K`` after the K-th staged file is renamed into its stream, before
  the stream's append has finished.

Never set it in production: it exists so tests can kill the broker at exact
points of the protocol.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pyarrow as pa

from npstream.broker.errors import BrokerError, InvalidArgumentError
from npstream.broker.sink.staging import (
    StagedTable,
    StagingArea,
    check_batch_id,
    check_sink_id,
    check_staging_id,
    remove_staging,
)
from npstream.broker.sink.staging_format import FORMAT, StagedFrames
from npstream.proto import pb

if TYPE_CHECKING:
    from npstream.broker.metadata import Metadata
    from npstream.broker.storage.log import StreamLog
    from npstream.broker.storage.prebuilt import PrebuiltFrame
    from npstream.broker.storage.staged_segment import StagedSegment
    from npstream.broker.streams.registry import StreamRegistry

__all__ = [
    "FAULT_ENV",
    "FAULT_EXIT_CODE",
    "CommitOutcome",
    "SinkCommitter",
    "SinkConflictError",
    "StagingNotFoundError",
    "parse_fault",
]

log = logging.getLogger(__name__)

FAULT_ENV = "NPSTREAM_SINK_FAULT"
# A staged file whose rows for its one target stream take at least this many bytes
# becomes a segment in place (storage/staged_segment.py); smaller ones are copied, so
# that small micro-batches do not leave a trail of small segments. [sink]
# sink_adopt_min_bytes in broker.toml.
DEFAULT_ADOPT_MIN_BYTES = 4 << 20
FAULT_EXIT_CODE = 86

SCHEMA = """
CREATE TABLE IF NOT EXISTS sink_state (
    sink_id       TEXT PRIMARY KEY,
    last_batch_id INTEGER NOT NULL,
    committed_ms  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sink_pending (
    sink_id     TEXT PRIMARY KEY,
    batch_id    INTEGER NOT NULL,
    staging_ids TEXT NOT NULL,      -- JSON list, in commit order
    streams     TEXT NOT NULL,      -- JSON list of target streams, sorted
    started_ms  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sink_markers (
    sink_id      TEXT NOT NULL,
    batch_id     INTEGER NOT NULL,
    stream       TEXT NOT NULL,
    first_offset INTEGER NOT NULL,
    row_count    INTEGER NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('committing', 'done')),
    timestamp_ms INTEGER,           -- the append's timestamp, reused if it is resumed
    PRIMARY KEY (sink_id, batch_id, stream)
) WITHOUT ROWID;
"""


class SinkConflictError(BrokerError):
    """The request contradicts the sink's state (another batch's commit is unfinished)."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    reason = pb.ERROR_REASON_SINK_CONFLICT


class StagingNotFoundError(BrokerError):
    """A commit lists a staging id the broker does not hold (aborted, expired or never staged)."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    reason = pb.ERROR_REASON_STAGING_NOT_FOUND


@dataclass(frozen=True)
class CommitOutcome:
    already_committed: bool
    written: dict[str, tuple[int, int]] = field(default_factory=dict)  # [start, end) per stream


@dataclass(frozen=True)
class _Pending:
    sink_id: str
    batch_id: int
    staging_ids: list[str]
    streams: list[str]


@dataclass(frozen=True)
class _Marker:
    first_offset: int
    row_count: int
    state: str
    timestamp: int | None  # the append's timestamp (None: recorded by an older broker)


# ---------------------------------------------------------------- fault hook (tests only)


# Crash points counted in staged files (StagedSegment.on_event names them).
_FILE_EVENTS = ("stamped", "renaming", "adopted")


@dataclass(frozen=True)
class Fault:
    point: str  # "marker" | "append" | "torn" | "done" | "stamped" | "renaming" | "adopted"
    amount: int = 0   # bytes kept for "torn", streams done for "done", files for the others


def parse_fault(text: str | None) -> Fault | None:
    """The fault of NPSTREAM_SINK_FAULT, None when unset; ValueError when malformed."""
    if not text:
        return None
    point, _, amount = text.partition(":")
    if point in ("marker", "append") and not amount:
        return Fault(point)
    if point in ("torn", "done", *_FILE_EVENTS) and amount.isdigit():
        return Fault(point, int(amount))
    raise ValueError(
        f"invalid {FAULT_ENV}={text!r}: use marker, append, torn:<bytes>, done:<streams>, "
        "stamped:<files>, renaming:<files> or adopted:<files>"
    )


def _die(reason: str) -> None:
    log.critical("test fault hook %s: exiting now (%s)", FAULT_ENV, reason)
    logging.shutdown()
    os._exit(FAULT_EXIT_CODE)


def _segment_sizes(stream_dir: Path) -> dict[Path, int]:
    """Sizes of every file of a stream (the torn-write fault cuts the one that grew)."""
    try:
        return {p: p.stat().st_size for p in stream_dir.iterdir() if p.is_file()}
    except FileNotFoundError:
        return {}


def _tear(stream_dir: Path, before: dict[Path, int], keep_bytes: int) -> None:
    """Cut the segment bytes written since ``before`` back to keep_bytes in total."""
    from npstream.broker.storage.files import SEGMENT_SUFFIX

    after = _segment_sizes(stream_dir)
    grown = sorted(p for p, size in after.items()
                   if size > before.get(p, 0) and p.suffix == SEGMENT_SUFFIX)
    for index, path in enumerate(grown):
        base = before.get(path, 0)
        with open(path, "r+b") as handle:
            handle.truncate(base + keep_bytes if index == 0 else base)
            handle.flush()
            os.fsync(handle.fileno())


# ---------------------------------------------------------------- committer


class SinkCommitter:
    """Commits, aborts, recovery and GC of one broker's sinks; thread-safe (a lock per sink)."""

    def __init__(
        self,
        metadata: Metadata,
        streams: StreamRegistry,
        staging: StagingArea,
        *,
        streams_dir: Path | None = None,
        durable_metadata: bool = True,
        fault: Fault | None = None,
        adopt_min_bytes: int = DEFAULT_ADOPT_MIN_BYTES,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._metadata = metadata
        self._streams = streams
        self.staging = staging
        self._streams_dir = streams_dir
        self._durable_metadata = durable_metadata
        self._fault = fault
        self._clock = clock
        self._locks_guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._adopt_min_bytes = adopt_min_bytes
        self._events = 0
        metadata.executescript(SCHEMA)
        columns = {row[1] for row in metadata.execute("PRAGMA table_info(sink_markers)")}
        if "timestamp_ms" not in columns:  # created by an older broker
            metadata.execute("ALTER TABLE sink_markers ADD COLUMN timestamp_ms INTEGER")

    def _lock(self, sink_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(sink_id, threading.Lock())

    # ------------------------------------------------------------ queries

    def last_batch_id(self, sink_id: str) -> int | None:
        rows = self._metadata.execute(
            "SELECT last_batch_id FROM sink_state WHERE sink_id = ?", (sink_id,))
        return int(rows[0][0]) if rows else None

    def state(self, sink_id: str) -> tuple[bool, int]:
        """(exists, last committed batch id or -1): a sink exists once it staged or committed."""
        check_sink_id(sink_id)
        last = self.last_batch_id(sink_id)
        if last is not None:
            return True, last
        exists = bool(self._pending(sink_id)) or (self.staging.root / sink_id).is_dir()
        return exists, -1

    def _pending(self, sink_id: str) -> _Pending | None:
        rows = self._metadata.execute(
            "SELECT batch_id, staging_ids, streams FROM sink_pending WHERE sink_id = ?",
            (sink_id,))
        if not rows:
            return None
        return _Pending(sink_id, int(rows[0][0]), json.loads(rows[0][1]), json.loads(rows[0][2]))

    def _all_pending(self) -> list[_Pending]:
        rows = self._metadata.execute(
            "SELECT sink_id, batch_id, staging_ids, streams FROM sink_pending ORDER BY sink_id")
        return [_Pending(r[0], int(r[1]), json.loads(r[2]), json.loads(r[3])) for r in rows]

    def _marker(self, pending: _Pending, stream: str) -> _Marker | None:
        rows = self._metadata.execute(
            "SELECT first_offset, row_count, state, timestamp_ms FROM sink_markers "
            "WHERE sink_id = ? AND batch_id = ? AND stream = ?",
            (pending.sink_id, pending.batch_id, stream))
        if not rows:
            return None
        return _Marker(int(rows[0][0]), int(rows[0][1]), rows[0][2],
                       None if rows[0][3] is None else int(rows[0][3]))

    def is_committed(self, sink_id: str, batch_id: int) -> bool:
        """True when the batch is committed: staging for it would never be appended."""
        last = self.last_batch_id(sink_id)
        return last is not None and batch_id <= last

    # ------------------------------------------------------------ commit

    def commit(self, sink_id: str, batch_id: int, staging_ids: list[str]) -> CommitOutcome:
        """Append the listed stagings atomically per stream, record the batch (module doc)."""
        check_sink_id(sink_id)
        check_batch_id(batch_id)
        for staging_id in staging_ids:
            check_staging_id(staging_id)
        if len(set(staging_ids)) != len(staging_ids):
            raise InvalidArgumentError(
                f"commit of sink '{sink_id}' batch {batch_id} lists a staging id twice")
        with self._lock(sink_id):
            last = self.last_batch_id(sink_id)
            if last is not None and batch_id <= last:
                log.info("sink '%s' batch %d already committed (last committed batch %d); "
                         "nothing appended", sink_id, batch_id, last)
                self.staging.drop_up_to(sink_id, last)
                return CommitOutcome(True)
            pending = self._pending(sink_id)
            if pending is not None and pending.batch_id != batch_id:
                raise SinkConflictError(
                    f"sink '{sink_id}' has an unfinished commit of batch {pending.batch_id}; "
                    f"retry that commit before committing batch {batch_id}")
            if pending is None:
                pending = self._begin(sink_id, batch_id, staging_ids)
            return CommitOutcome(False, self._run(pending))

    def _begin(self, sink_id: str, batch_id: int, staging_ids: list[str]) -> _Pending:
        """Check every staging exists, create the targets, record the pending commit."""
        missing = [s for s in staging_ids if not self.staging.exists(sink_id, batch_id, s)]
        if missing:
            raise StagingNotFoundError(
                f"cannot commit sink '{sink_id}' batch {batch_id}: staging "
                f"{', '.join(repr(m) for m in missing)} not found (aborted, expired after "
                "sink_staging_ttl, or never staged); nothing was appended")
        streams: set[str] = set()
        for staging_id in staging_ids:
            streams.update(self.staging.targets(sink_id, batch_id, staging_id))
        for stream in sorted(streams):  # NOT_FOUND here, before anything is recorded
            self._streams.get(stream, create_if_missing=True)
        pending = _Pending(sink_id, batch_id, list(staging_ids), sorted(streams))
        self._metadata.execute(
            "INSERT INTO sink_pending (sink_id, batch_id, staging_ids, streams, started_ms) "
            "VALUES (?, ?, ?, ?, ?)",
            (sink_id, batch_id, json.dumps(pending.staging_ids), json.dumps(pending.streams),
             self._clock()))
        self._sync_metadata()
        return pending

    def _run(self, pending: _Pending) -> dict[str, tuple[int, int]]:
        """Append every stream of a pending commit not done yet, then record the batch."""
        started = time.perf_counter()
        staged = [self._open_staging(pending, s) for s in pending.staging_ids]
        written: dict[str, tuple[int, int]] = {}
        for done_streams, stream in enumerate(pending.streams, start=1):
            written[stream] = self._commit_stream(
                pending, stream, [s for s in staged if stream in s.streams])
            if self._fault and self._fault.point == "done" and done_streams >= self._fault.amount:
                _die(f"after {done_streams} stream(s) of sink '{pending.sink_id}' "
                     f"batch {pending.batch_id}")
        adopted = sum(1 for s in staged  # moved into a stream: adopted (current format only)
                      if isinstance(s, StagedFrames) and s.format >= FORMAT
                      and not s.path.exists())
        self._finish(pending)
        rows = sum(end - start for start, end in written.values())
        log.info("sink '%s' committed batch %d: %d rows from %d staging(s) (%d adopted as "
                 "segments) in %.0f ms: %s",
                 pending.sink_id, pending.batch_id, rows, len(pending.staging_ids), adopted,
                 (time.perf_counter() - started) * 1000,
                 ", ".join(f"{s}[{a},{b})" for s, (a, b) in written.items()) or "(empty)")
        return written

    def _open_staging(self, pending: _Pending, staging_id: str) -> StagedFrames | StagedTable:
        """A staging's frames (mapped, not read), or its table for a file of an older broker."""
        frames = self.staging.open_frames(pending.sink_id, pending.batch_id, staging_id)
        if frames is not None:
            return frames
        return self.staging.read(pending.sink_id, pending.batch_id, staging_id)

    def _commit_stream(self, pending: _Pending, stream: str,
                       staged: list[StagedFrames | StagedTable]) -> tuple[int, int]:
        """Append one stream's rows of the commit exactly once; returns [start, end)."""
        frames = [s for s in staged if isinstance(s, StagedFrames)]
        tables: list[pa.Table] = []
        if len(frames) == len(staged):
            counts = [s.count_for(stream) for s in frames]
        else:  # staging written by an older broker: rows, not frames
            tables = [t for t in (s.rows_for(stream) for s in staged) if t.num_rows]
            counts = [t.num_rows for t in tables]
        row_count = sum(counts)
        marker = self._marker(pending, stream)
        if marker is not None and marker.state == "done":
            return marker.first_offset, marker.first_offset + marker.row_count
        stream_log = self._streams.get(stream, create_if_missing=True)
        resume = 0  # stagings already in the log (a crash interrupted this append)
        if marker is not None:
            resume = self._settle(pending, stream, stream_log, marker,
                                  counts if not tables else [row_count])
            if resume < 0:
                return marker.first_offset, marker.first_offset + marker.row_count
        if not row_count:
            self._record_marker(pending, stream, stream_log.end_offset, 0, "done")
            return stream_log.end_offset, stream_log.end_offset
        before: dict[Path, int] = {}

        def before_write(first_offset: int, timestamp: int | None = None) -> None:
            self._record_marker(pending, stream, first_offset, row_count, "committing",
                                timestamp)
            if self._fault is None:
                return
            if self._fault.point == "marker":
                _die(f"marker recorded for '{stream}' at offset {first_offset}")
            if self._fault.point == "torn" and self._streams_dir is not None:
                before.update(_segment_sizes(self._streams_dir / stream))

        try:
            if not tables:
                # Resuming, the marker stays as recorded: the append continues where the
                # stagings already in the log end, with the interrupted append's timestamp.
                resumed_at = (marker.first_offset + sum(counts[:resume])
                              if resume and marker is not None else None)
                result = stream_log.append_prebuilt(
                    self._parts(pending, stream, frames[resume:]),
                    before_write=None if resume else before_write,
                    timestamp=marker.timestamp if marker is not None else None,
                    expect_first=resumed_at)
            else:
                # One contiguous table: the storage engine frames it about twice as fast
                # as the same rows in many chunks (measured), and copies it anyway.
                combined = pa.concat_tables(tables, promote_options="default").combine_chunks()
                result = stream_log.append_atomic([combined], before_write=before_write)
        except Exception:
            if stream_log.failed or resume:
                # A disk error after (or while undoing) the write, or an adoption that
                # cannot be undone: the rows may be in the files, and the log refuses
                # every write until a restart reopens it. The 'committing' marker stays,
                # so that recovery at the restart settles them by the end offset it
                # finds: never appended twice.
                log.error("sink '%s' batch %d: append to '%s' failed part way; the commit "
                          "finishes when the broker restarts", pending.sink_id,
                          pending.batch_id, stream)
                raise
            # Otherwise the append failed before writing or undid its write: none of these
            # rows is in the log, and other writers may append at first_offset from now
            # on, so the marker must go (a retried commit starts this stream afresh
            # instead of truncating their data).
            self._delete_marker(pending, stream)
            raise
        if self._fault is not None and self._fault.point in ("append", "torn"):
            if self._fault.point == "torn" and self._streams_dir is not None:
                _tear(self._streams_dir / stream, before, self._fault.amount)
            _die(f"appended '{stream}' at offset {result.first_offset}, marker not done")
        self._mark_done(pending, stream)
        first = marker.first_offset if resume and marker is not None else result.first_offset
        return first, first + row_count

    def _settle(self, pending: _Pending, stream: str, stream_log: StreamLog, marker: _Marker,
                counts: list[int]) -> int:
        """After an interrupted append: -1 when it completed, else the staging to go on from.

        Each staging's rows start at a known offset (the marker's first offset
        plus the rows before it), and a staging is written whole (adopted by a
        rename, or copied frame by frame and cut back at a torn frame), so the
        log's end shows how far the append got: the log is cut back to the
        start of the staging it ends in, and the append goes on from there.
        """
        # After a disk error the append may be on disk but not durable: only a
        # restart (which reopens the log and checks its files) can tell.
        stream_log.check_writable()
        end = stream_log.end_offset
        first, rows = marker.first_offset, marker.row_count
        if end >= first + rows:
            self._mark_done(pending, stream)
            log.warning("sink '%s' batch %d: append to '%s' at [%d,%d) had completed; "
                        "marked done", pending.sink_id, pending.batch_id, stream, first,
                        first + rows)
            return -1
        if end <= first:
            log.warning("sink '%s' batch %d: append to '%s' at offset %d had no complete "
                        "row on disk; writing it again", pending.sink_id, pending.batch_id,
                        stream, first)
            return 0
        resume, start = 0, first
        while resume + 1 < len(counts) and start + counts[resume] <= end:
            start += counts[resume]
            resume += 1
        if end > start:
            stream_log.truncate_to(start)
        log.warning("sink '%s' batch %d: append to '%s' at offset %d was torn (%d of %d rows "
                    "on disk); truncated to offset %d and writing it again from there",
                    pending.sink_id, pending.batch_id, stream, first, end - first, rows, start)
        return resume

    def _parts(self, pending: _Pending, stream: str,
               staged: list[StagedFrames]) -> list[PrebuiltFrame | StagedSegment]:
        """What to append for one stream: large single-stream files adopted, others copied."""
        parts: list[PrebuiltFrame | StagedSegment] = []
        same_filesystem = self._same_filesystem()
        for item in staged:
            if not item.count_for(stream):
                continue
            if not item.path.exists():
                raise StagingNotFoundError(
                    f"cannot finish sink '{pending.sink_id}' batch {pending.batch_id}: the data "
                    f"of staging '{item.staging_id}' for '{stream}' is gone (moved into the "
                    "stream, whose log no longer holds it)")
            segment = (item.segment_for(stream) if same_filesystem
                       and item.bytes_for(stream) >= self._adopt_min_bytes else None)
            if segment is None:
                parts.extend(item.frames_for(stream))
            elif self._fault is not None and self._fault.point in _FILE_EVENTS:
                parts.append(replace(segment, on_event=self._count_event))
            else:
                parts.append(segment)
        return parts

    def _same_filesystem(self) -> bool:
        """Whether staging and streams share a filesystem (a rename cannot cross one)."""
        if self._streams_dir is None:
            return False
        try:
            return os.stat(self.staging.root).st_dev == os.stat(self._streams_dir).st_dev
        except FileNotFoundError:
            return False

    def _count_event(self, name: str) -> None:
        """Test crash points stamped:K / renaming:K / adopted:K (module doc)."""
        assert self._fault is not None
        if name == self._fault.point:
            self._events += 1
            if self._events >= self._fault.amount:
                _die(f"{self._events} staging file(s) {name}")

    def _record_marker(self, pending: _Pending, stream: str, first_offset: int,
                       row_count: int, state: str, timestamp: int | None = None) -> None:
        self._metadata.execute(
            "INSERT OR REPLACE INTO sink_markers (sink_id, batch_id, stream, first_offset, "
            "row_count, state, timestamp_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (pending.sink_id, pending.batch_id, stream, first_offset, row_count, state,
             timestamp))
        if state == "committing":
            self._sync_metadata()

    def _delete_marker(self, pending: _Pending, stream: str) -> None:
        self._metadata.execute(
            "DELETE FROM sink_markers WHERE sink_id = ? AND batch_id = ? AND stream = ?",
            (pending.sink_id, pending.batch_id, stream))

    def _mark_done(self, pending: _Pending, stream: str) -> None:
        self._metadata.execute(
            "UPDATE sink_markers SET state = 'done' WHERE sink_id = ? AND batch_id = ? "
            "AND stream = ?", (pending.sink_id, pending.batch_id, stream))

    def _finish(self, pending: _Pending) -> None:
        """Record the batch as committed, forget the commit's markers, drop its staging."""
        with self._metadata.transaction():
            self._metadata.execute(
                "INSERT INTO sink_state (sink_id, last_batch_id, committed_ms) VALUES (?, ?, ?) "
                "ON CONFLICT (sink_id) DO UPDATE SET last_batch_id = excluded.last_batch_id, "
                "committed_ms = excluded.committed_ms",
                (pending.sink_id, pending.batch_id, self._clock()))
            self._metadata.execute("DELETE FROM sink_pending WHERE sink_id = ?",
                                   (pending.sink_id,))
            self._metadata.execute("DELETE FROM sink_markers WHERE sink_id = ?",
                                   (pending.sink_id,))
        self._sync_metadata()
        self.staging.drop_up_to(pending.sink_id, pending.batch_id)

    def _sync_metadata(self) -> None:
        """Make what was just committed to SQLite survive a power loss (see module doc)."""
        if self._durable_metadata:
            self._metadata.execute("PRAGMA wal_checkpoint(PASSIVE)")

    # ------------------------------------------------------------ abort, recovery, GC

    def abort(self, sink_id: str, batch_id: int, staging_ids: list[str] | None) -> int:
        """Drop staging of a batch (all when None); refused while its commit is unfinished."""
        check_sink_id(sink_id)
        check_batch_id(batch_id)
        for staging_id in staging_ids or []:
            check_staging_id(staging_id)
        with self._lock(sink_id):
            pending = self._pending(sink_id)
            if pending is not None and pending.batch_id == batch_id:
                raise SinkConflictError(
                    f"cannot abort sink '{sink_id}' batch {batch_id}: its commit has started "
                    "and will be finished (retry CommitBatch)")
            dropped = self.staging.drop(sink_id, batch_id, staging_ids or None)
        log.info("sink '%s' batch %d aborted: %d staging file(s) dropped",
                 sink_id, batch_id, dropped)
        return dropped

    def recover(self) -> int:
        """Finish every commit a crash interrupted; drop staging of committed batches.

        Runs before the broker serves. Returns the number of commits finished.
        """
        finished = 0
        for pending in self._all_pending():
            log.warning("sink '%s' batch %d: finishing a commit interrupted by a restart "
                        "(%d staging(s), streams %s)", pending.sink_id, pending.batch_id,
                        len(pending.staging_ids), pending.streams)
            with self._lock(pending.sink_id):
                self._run(pending)
            finished += 1
        for sink_id in self.staging.sinks():
            last = self.last_batch_id(sink_id)
            if last is not None:
                self.staging.drop_up_to(sink_id, last)
        for tmp in list(self.staging.temp_files()):  # no Stage is in flight before serving
            tmp.unlink(missing_ok=True)
        for orphan in list(self.staging.orphan_indexes()):  # no commit is pending any more
            orphan.path.unlink(missing_ok=True)
        self.staging.remove_empty_dirs()
        return finished

    def sweep(self, ttl_ms: int) -> int:
        """Delete staging older than ttl_ms that no unfinished commit lists; returns files."""
        now = self._clock()
        protected = {(p.sink_id, p.batch_id) for p in self._all_pending()}
        last_by_sink: dict[str, int | None] = {}
        dropped = 0
        for item in list(self.staging.files()):
            if item.sink_id not in last_by_sink:
                last_by_sink[item.sink_id] = self.last_batch_id(item.sink_id)
            last = last_by_sink[item.sink_id]
            committed = last is not None and item.batch_id <= last
            try:
                expired = now - item.mtime_ms() > ttl_ms
            except FileNotFoundError:
                continue
            if (committed or expired) and (item.sink_id, item.batch_id) not in protected:
                with self._lock(item.sink_id):
                    if (item.sink_id, item.batch_id) in {
                        (p.sink_id, p.batch_id) for p in self._all_pending()}:
                        continue
                    remove_staging(item.path)
                dropped += 1
                log.info("sink '%s' batch %d: dropped %s staging '%s'", item.sink_id,
                         item.batch_id, "committed" if committed else "expired", item.staging_id)
        for tmp in [*self.staging.temp_files(),
                    *(orphan.path for orphan in self.staging.orphan_indexes()
                      if (orphan.sink_id, orphan.batch_id) not in protected)]:
            try:
                if now - int(tmp.stat().st_mtime * 1000) > ttl_ms:
                    tmp.unlink(missing_ok=True)
            except FileNotFoundError:
                continue
        self.staging.remove_empty_dirs()
        return dropped

    def on_stream_deleted(self, stream: str) -> None:
        """Forget a deleted stream: its markers, unfinished commits' rows for it, its staging."""
        for pending in self._all_pending():
            if stream in pending.streams:
                with self._lock(pending.sink_id):
                    remaining = [s for s in pending.streams if s != stream]
                    self._metadata.execute(
                        "UPDATE sink_pending SET streams = ? WHERE sink_id = ?",
                        (json.dumps(remaining), pending.sink_id))
        self._metadata.execute("DELETE FROM sink_markers WHERE stream = ?", (stream,))
        protected = {(p.sink_id, p.batch_id) for p in self._all_pending()}
        dropped = 0
        for item in list(self.staging.files()):
            if (item.sink_id, item.batch_id) in protected:
                continue
            try:
                targets = self.staging.targets(item.sink_id, item.batch_id, item.staging_id)
            except (FileNotFoundError, pa.ArrowInvalid):
                continue
            if targets == [stream]:
                remove_staging(item.path)
                dropped += 1
        self.staging.remove_empty_dirs()
        if dropped:
            log.info("stream '%s' deleted: dropped %d staging file(s) that targeted only it",
                     stream, dropped)

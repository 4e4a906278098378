"""Atomic sink commits: the listed stagings appended exactly once, contiguous per stream.

The promise: once CommitBatch(sink_id, batch_id, staging_ids) has replied, the
rows of exactly the listed stagings are in their target streams exactly once,
contiguous per stream, and (sink_id, batch_id) is recorded so that a replay of
that commit appends nothing. A broker crash at any point of a commit is
repaired at the next start, before anything is served, by finishing it (roll
forward, recovery.py): staged data is durable, so the commit never has to be
undone.

A commit records itself as pending (markers.py), then appends each target
stream's rows with ``StreamLog.append`` of a FramedAppend, whose ``before_write``
callback records the stream's 'committing' marker (first offset, row count,
timestamp) under the log's append lock, before any byte is written; nothing
else can append to the stream until the sink's rows are written and
fsynced. Large staged files of one stream are adopted (stamped in place and
renamed into the stream as a segment, storage/staged_segment.py; whether a
file is adopted is storage's call, ``StreamLog.can_adopt``), the others
copied. Once every stream is done, one transaction records the batch and
the staging is dropped.

An append that fails on a disk error (fsync, or undoing a partial write)
leaves the log refusing writes until the broker restarts, with the rows
possibly in its files: the marker stays 'committing' and the restart settles
it (recovery.py). Any other failure wrote nothing, and the marker is deleted.

Tests stop the broker at exact points of a commit through the fault points
``sink.marker``, ``sink.appended`` and ``sink.stream_done`` (npstream.broker.faults).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from npstream.broker import faults
from npstream.broker.errors import (
    DiskFullError,
    InvalidArgumentError,
    SchemaIncompatibleError,
    SinkConflictError,
    StagingNotFoundError,
    is_disk_full,
)
from npstream.broker.log_events import event_fields
from npstream.broker.sink.markers import Marker, Pending, SinkMarkers
from npstream.broker.sink.recovery import settle
from npstream.broker.sink.staging import (
    StagingArea,
    check_batch_id,
    check_sink_id,
    check_staging_id,
)
from npstream.broker.sink.staging_format import StagedFrames
from npstream.broker.storage.framed_append import FramedAppend
from npstream.proto.value_schema import to_ddl

if TYPE_CHECKING:
    from npstream.broker.storage.log import StreamLog
    from npstream.broker.storage.prebuilt import PrebuiltFrame
    from npstream.broker.storage.staged_segment import StagedSegment
    from npstream.broker.streams.registry import StreamRegistry

__all__ = [
    "CommitOutcome",
    "SinkCommitter",
]

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class CommitOutcome:
    already_committed: bool
    written: dict[str, tuple[int, int]] = field(default_factory=dict)  # [start, end) per stream


def _check_schemas(sink_id: str, batch_id: int, stream: str, stream_log: StreamLog,
                   framed: dict[str, tuple[int, pa.Schema | None]]) -> None:
    """SchemaIncompatibleError unless each staging's rows fit the stream's schemas now.

    ``framed``: staging id -> (version, value schema) its rows for ``stream``
    were framed in (0, None: untyped). A stream that was typed at Stage time
    must still have that version with that schema (not deleted and
    re-created with another), and an untyped staging needs an untyped stream.
    """
    schemas = stream_log.value_schemas
    for staging_id, (version, value_schema) in framed.items():
        now = schemas.values.get(version) if version else None
        if (not version and not schemas.typed) or (
                now is not None and value_schema is not None and now.equals(value_schema)):
            continue
        staged_as = (f"in value schema version {version} ({to_ddl(value_schema)})"
                     if version and value_schema is not None else "untyped (binary values)")
        has = (f"typed (current version {schemas.current}: "
               f"{to_ddl(schemas.current_value_schema)})" if schemas.typed else "untyped")
        raise SchemaIncompatibleError(
            f"cannot commit sink '{sink_id}' batch {batch_id}: staging '{staging_id}' holds "
            f"rows for stream '{stream}' {staged_as}, but the stream is now {has}; nothing "
            "was appended. Abort the batch and write it again (a restarted query re-stages it)")



def _commit_fields(sink_id: str, batch_id: int, rows: int,
                   written: dict[str, tuple[int, int]]) -> dict[str, object]:
    """The JSON log fields of a commit: its stream and offsets when it wrote one stream."""
    one = next(iter(written.items())) if len(written) == 1 else None
    return event_fields(sink_id=sink_id, batch_id=batch_id, count=rows,
                        stream=one[0] if one else None,
                        start_offset=one[1][0] if one else None,
                        end_offset=one[1][1] if one else None)

class SinkCommitter:
    """Commits and aborts of one broker's sinks; thread-safe (each sink's lock, markers.py)."""

    def __init__(
        self,
        markers: SinkMarkers,
        streams: StreamRegistry,
        staging: StagingArea,
        *,
        adopt_min_bytes: int,
        write_guard: Callable[[str], AbstractContextManager[None]] = lambda _s: nullcontext(),
    ) -> None:
        """``write_guard(stream)`` is entered around each append to ``stream``: it raises
        when rows may not be appended there now (it is being moved to another member, or
        moved away) and lets a move wait for the append (cluster/move.py).

        A staged file whose rows for its one target stream take at least
        ``adopt_min_bytes`` (broker.toml's sink_adopt_min_bytes) becomes a segment in
        place (storage/staged_segment.py); smaller ones are copied, so that small
        micro-batches do not leave a trail of small segments."""
        self.markers = markers
        self._streams = streams
        self.staging = staging
        self._adopt_min_bytes = adopt_min_bytes
        self._write_guard = write_guard

    # ------------------------------------------------------------ queries

    def state(self, sink_id: str) -> tuple[bool, int]:
        """(exists, last committed batch id or -1): a sink exists once it staged or committed."""
        check_sink_id(sink_id)
        last = self.markers.last_batch_id(sink_id)
        if last is not None:
            return True, last
        exists = bool(self.markers.pending(sink_id)) or (self.staging.root / sink_id).is_dir()
        return exists, -1

    def is_committed(self, sink_id: str, batch_id: int) -> bool:
        """True when the batch is committed: staging for it would never be appended."""
        return self.markers.is_committed(sink_id, batch_id)

    # ------------------------------------------------------------ commit, abort

    def commit(self, sink_id: str, batch_id: int, staging_ids: list[str]) -> CommitOutcome:
        """Append the listed stagings atomically per stream, record the batch (module doc)."""
        check_sink_id(sink_id)
        check_batch_id(batch_id)
        for staging_id in staging_ids:
            check_staging_id(staging_id)
        if len(set(staging_ids)) != len(staging_ids):
            raise InvalidArgumentError(
                f"commit of sink '{sink_id}' batch {batch_id} lists a staging id twice")
        with self.markers.lock(sink_id):
            last = self.markers.last_batch_id(sink_id)
            if last is not None and batch_id <= last:
                log.info("sink '%s' batch %d already committed (last committed batch %d); "
                         "nothing appended", sink_id, batch_id, last)
                self.staging.drop_up_to(sink_id, last)
                return CommitOutcome(True)
            pending = self.markers.pending(sink_id)
            if pending is not None and pending.batch_id != batch_id:
                raise SinkConflictError(
                    f"sink '{sink_id}' has an unfinished commit of batch {pending.batch_id}; "
                    f"retry that commit before committing batch {batch_id}")
            if pending is None:
                pending = self._begin(sink_id, batch_id, staging_ids)
            return CommitOutcome(False, self.run(pending))

    def abort(self, sink_id: str, batch_id: int, staging_ids: list[str] | None) -> int:
        """Drop staging of a batch (all when None); refused while its commit is unfinished."""
        check_sink_id(sink_id)
        check_batch_id(batch_id)
        for staging_id in staging_ids or []:
            check_staging_id(staging_id)
        with self.markers.lock(sink_id):
            pending = self.markers.pending(sink_id)
            if pending is not None and pending.batch_id == batch_id:
                raise SinkConflictError(
                    f"cannot abort sink '{sink_id}' batch {batch_id}: its commit has started "
                    "and will be finished (retry CommitBatch)")
            dropped = self.staging.drop(sink_id, batch_id, staging_ids or None)
        log.info("sink '%s' batch %d aborted: %d staging file(s) dropped",
                 sink_id, batch_id, dropped,
                 extra=event_fields(sink_id=sink_id, batch_id=batch_id, count=dropped))
        return dropped

    def _begin(self, sink_id: str, batch_id: int, staging_ids: list[str]) -> Pending:
        """Check every staging exists, create the targets, record the pending commit."""
        missing = [s for s in staging_ids if not self.staging.exists(sink_id, batch_id, s)]
        if missing:
            raise StagingNotFoundError(
                f"cannot commit sink '{sink_id}' batch {batch_id}: staging "
                f"{', '.join(repr(m) for m in missing)} not found (aborted, expired after "
                "sink_staging_ttl, or never staged); nothing was appended")
        # StagingFormatError for an older broker's staging
        staged = [self.staging.open_frames(sink_id, batch_id, s) for s in staging_ids]
        streams = sorted({stream for item in staged for stream in item.streams})
        # Every target's write guard is held until the pending commit is recorded: a
        # stream being moved refuses the commit now rather than half way, and a move
        # that starts meanwhile waits, then sees the commit (and does not go on).
        with ExitStack() as guards:
            for stream in streams:  # NOT_FOUND or a schema refusal here, before any record
                guards.enter_context(self._write_guard(stream))
                framed = {item.staging_id: item.schema_for(stream)
                          for item in staged if stream in item.streams}
                typed = any(version for version, _schema in framed.values())
                # A typed staging's stream existed at Stage time: it is not re-created untyped.
                stream_log = self._streams.get(stream, create_if_missing=not typed)
                _check_schemas(sink_id, batch_id, stream, stream_log, framed)
            return self.markers.begin(sink_id, batch_id, staging_ids, streams)

    def run(self, pending: Pending) -> dict[str, tuple[int, int]]:
        """Append every stream of a pending commit not done yet, then record the batch.

        The caller holds the sink's lock; recovery runs interrupted commits here too.
        """
        started = time.perf_counter()
        staged = [self.staging.open_frames(pending.sink_id, pending.batch_id, s)
                  for s in pending.staging_ids]
        written: dict[str, tuple[int, int]] = {}
        for done_streams, stream in enumerate(pending.streams, start=1):
            try:
                written[stream] = self._commit_stream(
                    pending, stream, [s for s in staged if stream in s.streams])
            except Exception as exc:
                if is_disk_full(exc):  # the marker rules above hold; say which commit it was
                    raise DiskFullError(
                        stream, f"commit of sink '{pending.sink_id}' batch {pending.batch_id}",
                        exc, "the commit is unfinished (no row is ever appended twice)") from exc
                raise
            faults.hit("sink.stream_done", pending.sink_id, pending.batch_id, done_streams)
        adopted = sum(1 for s in staged if not s.path.exists())  # moved into a stream
        self.markers.finish(pending)
        self.staging.drop_up_to(pending.sink_id, pending.batch_id)
        rows = sum(end - start for start, end in written.values())
        log.info("sink '%s' committed batch %d: %d rows from %d staging(s) (%d adopted as "
                 "segments) in %.0f ms: %s",
                 pending.sink_id, pending.batch_id, rows, len(pending.staging_ids), adopted,
                 (time.perf_counter() - started) * 1000,
                 ", ".join(f"{s}[{a},{b})" for s, (a, b) in written.items()) or "(empty)",
                 extra=_commit_fields(pending.sink_id, pending.batch_id, rows, written))
        return written

    def _commit_stream(self, pending: Pending, stream: str,
                       staged: list[StagedFrames]) -> tuple[int, int]:
        """Append one stream's rows of the commit exactly once; returns [start, end)."""
        counts = [s.count_for(stream) for s in staged]
        marker = self.markers.marker(pending, stream)
        if marker is not None and marker.state == "done":
            return marker.first_offset, marker.first_offset + marker.row_count
        with self._write_guard(stream):
            return self._append_stream(pending, stream, staged, counts, marker)

    def _append_stream(self, pending: Pending, stream: str, staged: list[StagedFrames],
                       counts: list[int], marker: Marker | None) -> tuple[int, int]:
        """``_commit_stream``'s append, under the stream's write guard."""
        row_count = sum(counts)
        stream_log = self._streams.get(stream, create_if_missing=True)
        floor = self.markers.floor(pending.sink_id, stream)
        if marker is None and floor is not None and pending.batch_id <= floor:
            # The stream moved here from a member that had committed this batch into it.
            log.info("sink '%s' batch %d: its rows for '%s' are there from before the stream "
                     "moved to this member; nothing appended", pending.sink_id,
                     pending.batch_id, stream)
            self.markers.record(pending, stream, stream_log.end_offset, 0, "done")
            return stream_log.end_offset, stream_log.end_offset
        resume = 0  # stagings already in the log (a crash interrupted this append)
        if marker is not None:
            resume = settle(self.markers, pending, stream, stream_log, marker, counts)
            if resume < 0:
                return marker.first_offset, marker.first_offset + marker.row_count
        if not row_count:
            self.markers.record(pending, stream, stream_log.end_offset, 0, "done")
            return stream_log.end_offset, stream_log.end_offset

        def before_write(first_offset: int, timestamp: int) -> None:
            self.markers.record(pending, stream, first_offset, row_count, "committing",
                                timestamp)
            faults.hit("sink.marker", stream_log, first_offset)

        # Resuming, the marker stays as recorded: the append continues where the
        # stagings already in the log end, with the interrupted append's timestamp.
        resumed_at = (marker.first_offset + sum(counts[:resume])
                      if resume and marker is not None else None)
        try:
            result = stream_log.append(FramedAppend(
                self._parts(pending, stream, stream_log, staged[resume:]),
                before_write=None if resume else before_write,
                timestamp=marker.timestamp if marker is not None else None,
                expect_first=resumed_at))
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
            self.markers.delete(pending, stream)
            raise
        faults.hit("sink.appended", stream_log, result.first_offset)
        self.markers.mark_done(pending, stream)
        first = marker.first_offset if resume and marker is not None else result.first_offset
        return first, first + row_count

    def _parts(self, pending: Pending, stream: str, stream_log: StreamLog,
               staged: list[StagedFrames]) -> list[PrebuiltFrame | StagedSegment]:
        """What to append for one stream: files storage adopts whole, the others' frames."""
        parts: list[PrebuiltFrame | StagedSegment] = []
        for item in staged:
            if not item.count_for(stream):
                continue
            if not item.path.exists():
                raise StagingNotFoundError(
                    f"cannot finish sink '{pending.sink_id}' batch {pending.batch_id}: the data "
                    f"of staging '{item.staging_id}' for '{stream}' is gone (moved into the "
                    "stream, whose log no longer holds it)")
            segment = item.segment_for(stream)
            if segment is not None and stream_log.can_adopt(segment, self._adopt_min_bytes):
                parts.append(segment)
            else:
                parts.extend(item.frames_for(stream))
        return parts

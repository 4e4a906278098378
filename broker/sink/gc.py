"""Staging garbage collection: which staging can never be committed, and when it is deleted.

Staging is written before the driver knows whether its batch will commit,
so most of what is staged is deleted by someone other than a commit: a
commit drops its own batch's staging, AbortBatch the listed one, and the
rest falls to this module:

* at start, after recovery (nothing is in flight then): staging of batches
  already committed (a crash between the commit's record and its drop),
  temporary files of Stage calls cut off before their rename, and index
  files whose data file is gone (adopted by a commit that has finished);
* every ``interval_s`` (StagingSweeper): staging of committed batches, and
  staging older than ``sink_staging_ttl`` (a query that stopped for good),
  never that of a commit still pending; idle stage-inbox files too;
* when a stream is deleted: its markers, its place in unfinished commits, and
  staging that targets only it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pyarrow as pa

from npstream.broker.errors import StagingFormatError
from npstream.broker.sink.inbox import StageInbox
from npstream.broker.sink.markers import SinkMarkers, now_ms
from npstream.broker.sink.staging import StagingArea, remove_staging
from npstream.broker.sink.tuning import (
    SWEEP_MAX_INTERVAL_S,
    SWEEP_MIN_INTERVAL_S,
    SWEEP_TTL_FRACTION,
)

__all__ = ["StagingGC", "StagingSweeper"]

log = logging.getLogger(__name__)



class StagingGC:
    """Deletes staging nothing will commit; thread-safe (each sink's lock, markers.py)."""

    def __init__(self, markers: SinkMarkers, staging: StagingArea, *,
                 clock: Callable[[], int] = now_ms,
                 moved_away: Callable[[str], str | None] = lambda _stream: None) -> None:
        """``moved_away(stream)``: the member a stream was moved to, when it leaves this
        one by a move (cluster/move.py) rather than a delete (None)."""
        self._markers = markers
        self._staging = staging
        self._clock = clock
        self._moved_away = moved_away

    def after_recovery(self) -> None:
        """Drop what recovery left: committed batches' staging, temp files, orphan indexes."""
        staging = self._staging
        for sink_id in staging.sinks():
            last = self._markers.last_batch_id(sink_id)
            if last is not None:
                staging.drop_up_to(sink_id, last)
        for tmp in list(staging.temp_files()):  # no Stage is in flight before serving
            tmp.unlink(missing_ok=True)
        for orphan in list(staging.orphan_indexes()):  # no commit is pending any more
            orphan.path.unlink(missing_ok=True)
        staging.remove_empty_dirs()

    def sweep(self, ttl_ms: int) -> int:
        """Delete staging older than ttl_ms that no unfinished commit lists; returns files."""
        now = self._clock()
        protected = {(p.sink_id, p.batch_id) for p in self._markers.all_pending()}
        last_by_sink: dict[str, int | None] = {}
        dropped = 0
        for item in list(self._staging.files()):
            if item.sink_id not in last_by_sink:
                last_by_sink[item.sink_id] = self._markers.last_batch_id(item.sink_id)
            last = last_by_sink[item.sink_id]
            committed = last is not None and item.batch_id <= last
            try:
                expired = now - item.mtime_ms() > ttl_ms
            except FileNotFoundError:
                continue
            if (committed or expired) and (item.sink_id, item.batch_id) not in protected:
                with self._markers.lock(item.sink_id):
                    if (item.sink_id, item.batch_id) in {
                            (p.sink_id, p.batch_id) for p in self._markers.all_pending()}:
                        continue
                    remove_staging(item.path)
                dropped += 1
                log.info("sink '%s' batch %d: dropped %s staging '%s'", item.sink_id,
                         item.batch_id, "committed" if committed else "expired", item.staging_id)
        for tmp in [*self._staging.temp_files(),
                    *(orphan.path for orphan in self._staging.orphan_indexes()
                      if (orphan.sink_id, orphan.batch_id) not in protected)]:
            try:
                if now - int(tmp.stat().st_mtime * 1000) > ttl_ms:
                    tmp.unlink(missing_ok=True)
            except FileNotFoundError:
                continue
        self._staging.remove_empty_dirs()
        return dropped

    def on_stream_deleted(self, stream: str) -> None:
        """Forget a deleted stream: its markers, unfinished commits' rows for it, its staging.

        A stream that moved to another member keeps its staging here until
        the sweep (or a later commit of the sink): a late commit of it is then
        refused naming the new member (NOT_OWNER, "stage the batch again
        there") rather than "staging not found".
        """
        self._markers.forget_stream(stream)
        if self._moved_away(stream) is not None:
            return
        protected = {(p.sink_id, p.batch_id) for p in self._markers.all_pending()}
        dropped = 0
        for item in list(self._staging.files()):
            if (item.sink_id, item.batch_id) in protected:
                continue
            try:
                targets = self._staging.targets(item.sink_id, item.batch_id, item.staging_id)
            except (FileNotFoundError, pa.ArrowInvalid, StagingFormatError):
                continue  # gone meanwhile, or an older broker's: the sweep deletes it
            if targets == [stream]:
                remove_staging(item.path)
                dropped += 1
        self._staging.remove_empty_dirs()
        if dropped:
            log.info("stream '%s' deleted: dropped %d staging file(s) that targeted only it",
                     stream, dropped)


class StagingSweeper:
    """Background thread running the sweep (and the stage inbox's); ``close()`` stops it.

    ``on_dropped(files)`` is told how many staging files each sweep deleted
    (the service counts them).
    """

    def __init__(self, gc: StagingGC, ttl_ms: int, on_dropped: Callable[[int], None],
                 inbox: StageInbox | None = None) -> None:
        self._gc = gc
        self._inbox = inbox
        self.ttl_ms = ttl_ms
        self._on_dropped = on_dropped
        self.interval_s = min(max(ttl_ms / 1000 * SWEEP_TTL_FRACTION, SWEEP_MIN_INTERVAL_S),
                              SWEEP_MAX_INTERVAL_S)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sink-sweep", daemon=True)

    def start(self) -> StagingSweeper:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._on_dropped(self._gc.sweep(self.ttl_ms))
                if self._inbox is not None:
                    self._inbox.sweep()
            except Exception:
                log.exception("sink staging sweep failed; retrying in %.1fs", self.interval_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

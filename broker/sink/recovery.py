"""Roll-forward recovery: a commit a crash interrupted is finished at the restart, never undone.

Staged data is durable before a commit starts and the commit records where
its rows go before writing them (markers.py), so there is never a reason to
undo one: at the next start, before the broker serves anything, every
pending commit is run again, and each stream's append is settled from its
marker. When a 'committing' marker is found:

* ``end_offset >= first_offset + row_count``: the append completed (later
  offsets, if any, are other writers' data appended after it); mark it done.
* otherwise the crash interrupted it. Each staging's rows start at a known
  offset (the first offset plus the rows of the stagings listed before it),
  and nothing else could append meanwhile (the append held the log's lock
  from the marker on), so every offset from ``first_offset`` on belongs to
  the append. The log is cut back to the start of the staging it ends in (an
  adopted staging is whole or absent: only a copied one can be torn) and the
  append goes on from that staging with the marker's timestamp: the same rows
  with the same ids at the same offsets (ids missing at Stage were filled
  there, staging_format.py). Adopted files cannot be written again (they
  moved), which is why the append resumes rather than starting over.

The same settling runs when a client retries a commit whose append failed
part way in this process (a disk error leaves the marker 'committing').
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from npstream.broker.sink.markers import Marker, Pending, SinkMarkers

if TYPE_CHECKING:
    from npstream.broker.sink.committer import SinkCommitter
    from npstream.broker.sink.gc import StagingGC
    from npstream.broker.storage.log import StreamLog

__all__ = ["recover", "settle"]

log = logging.getLogger(__name__)


def recover(committer: SinkCommitter, gc: StagingGC) -> int:
    """Finish every commit a crash interrupted, then collect staging; commits finished.

    Runs before the broker serves, so no client sees a half-finished commit.
    """
    finished = 0
    for pending in committer.markers.all_pending():
        log.warning("sink '%s' batch %d: finishing a commit interrupted by a restart "
                    "(%d staging(s), streams %s)", pending.sink_id, pending.batch_id,
                    len(pending.staging_ids), pending.streams)
        with committer.markers.lock(pending.sink_id):
            committer.run(pending)
        finished += 1
    gc.after_recovery()
    return finished


def settle(markers: SinkMarkers, pending: Pending, stream: str, stream_log: StreamLog,
           marker: Marker, counts: list[int]) -> int:
    """After an interrupted append: -1 when it completed, else the staging to go on from.

    ``counts``: the rows of each staging of the append, in commit order. A
    staging is written whole (adopted by a rename, or copied frame by frame
    and cut back at a torn frame), so the log's end shows how far the append
    got (module doc).
    """
    # After a disk error the append may be on disk but not durable: only a
    # restart (which reopens the log and checks its files) can tell.
    stream_log.check_writable()
    end = stream_log.end_offset
    first, rows = marker.first_offset, marker.row_count
    if end >= first + rows:
        markers.mark_done(pending, stream)
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

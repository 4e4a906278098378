"""StreamLog: one stream's log - appends (group commit), reads, deletion, truncation, retention.

Concurrency model:

- ``_append_lock`` serialises everything that changes the log: the group-commit
  leader's write, roll, deletion, truncation, retention, config changes.
- Readers take no lock: they use the current ``LogView`` (reader.py), replaced
  under ``_state`` after each change; ``_state`` is also the condition that
  ``wait_for_data`` sleeps on.
- fsync runs outside the append lock under ``_sync_lock`` (the group-commit
  leader's, or the flusher's for WRITE-mode data; group_commit.py).
  ``_written_seq`` counts written groups; ``_synced_seq`` is the last count
  known durable. Rolling a segment fsyncs it first, so syncing the current
  tail covers everything written.

Timestamps are broker append times: max(clock(), last timestamp), one per
written group, so they never decrease within a stream. Data is visible to
readers as soon as it is written to the file (before the fsync); an append
with AckMode.FSYNC returns only after the covering fsync, one with
AckMode.WRITE after the write, and WRITE data is fsynced by the storage's
flusher within ``flush_interval_ms``.

Typed streams (docs/typed-streams.md): the broker's registry gives the log
its value schemas (``value_schemas`` at open, ``set_value_schemas`` on a
change). An append converts its values to the current version's struct
before it is queued (nothing stored when a value does not fit) and is written
with that version in the frame header; the lean paths for lone messages and
few Python values are for untyped streams only. Every decode uses the
frame's version (LogView.schemas); ``read(..., latest=True)`` converts older
versions' batches to the current version.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.group_commit import CommitQueue
from npstream.broker.storage.loader import LoadedLog
from npstream.broker.storage.log_appends import RECENT_MAX_BYTES, AppendPath
from npstream.broker.storage.log_deletion import Deletion
from npstream.broker.storage.log_reads import ReadPath
from npstream.broker.storage.settings import StorageSettings, StreamConfig
from npstream.broker.storage.value_schemas import UNTYPED, ValueSchemas

__all__ = ["RECENT_MAX_BYTES", "StreamLog"]


class StreamLog(AppendPath, ReadPath, Deletion):
    """The log of one stream. Thread-safe; obtained from Storage.open_log.

    Its parts: the shared state (log_state.py), the append path
    (log_appends.py), the read path (log_reads.py), deletion and retention
    (log_deletion.py).
    """

    def __init__(
        self,
        name: str,
        config: StreamConfig,
        directory: Path,
        loaded: LoadedLog,
        *,
        settings: StorageSettings,
        cache: FileCache,
        clock: Callable[[], int],
        on_dirty: Callable[[Any], None] | None = None,
        value_schemas: ValueSchemas = UNTYPED,
    ) -> None:
        super().__init__(name, config, directory, loaded, settings=settings, cache=cache,
                         clock=clock, on_dirty=on_dirty, value_schemas=value_schemas)
        # Weak references to its own methods: no reference cycle, so an evicted log
        # (open_logs.py) is freed as soon as its last user drops it, not at a
        # later garbage collection of every object in the broker.
        self._queue = CommitQueue(settings.max_batch_bytes, _weakly(self._write_group),
                                  _weakly(self._sync_through))


_A = TypeVar("_A")
_R = TypeVar("_R")


def _weakly(method: Callable[[_A], _R]) -> Callable[[_A], _R]:
    """``method`` (bound) called through a weak reference to its object."""
    ref = weakref.WeakMethod(method)

    def call(argument: _A) -> _R:
        bound = ref()
        if bound is None:  # only a caller holding the log calls it
            raise ReferenceError("the stream log is gone")
        return bound(argument)

    return call

"""The one background thread of the storage: fsyncs WRITE-mode data every flush_interval_ms.

Appends acknowledged with AckMode.WRITE return before their data is durable;
the log then registers itself here and this thread fsyncs it at the next
tick, which bounds the durability window to ``flush_interval_ms``. One thread
serves every stream, and streams with nothing unsynced cost nothing.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from npstream.broker.errors import BrokerError

if TYPE_CHECKING:
    from npstream.broker.storage.log import StreamLog

__all__ = ["Flusher"]

log = logging.getLogger(__name__)


class Flusher:
    def __init__(self, interval_ms: int) -> None:
        self.interval_s = interval_ms / 1000
        self._lock = threading.Lock()
        self._dirty: set[StreamLog] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="npstream-flusher", daemon=True)
        self._thread.start()

    def mark_dirty(self, stream_log: StreamLog) -> None:
        with self._lock:
            self._dirty.add(stream_log)

    def flush_now(self) -> None:
        """fsync every log marked dirty (one tick, in the caller's thread)."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        for stream_log in dirty:
            try:
                stream_log.flush()
            except (OSError, BrokerError) as exc:  # closed or failed: reported by the log
                log.warning("stream %s: periodic fsync failed: %s", stream_log.name, exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush_now()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.flush_now()

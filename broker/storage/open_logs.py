"""The logs kept in memory: the most recently used few held, the rest only while in use.

A stream's log state (its segment list, view, locks, dedup window, group
commit queue) costs a few kilobytes. A broker with a million streams, most of
them idle, cannot keep all of them, just as it cannot keep a million file
descriptors (file_cache.py). So the storage holds strong references to the
``max_open_logs`` logs used last, in LRU order; a log pushed out of that set
is no longer held by the storage, only found through a weak reference while
something else still uses it (an append in progress, a long-polling fetch, a
shared group listening to its tail, a PublishStream, the flusher with its
unsynced data). When nothing uses it any more Python frees it, and the next
use opens the stream again from its files (loader.py: a scan of the tail
segment, the dedup window rebuilt), like a broker restart does.

Nothing is closed under a user: an evicted log stays fully usable by whoever
holds it, and ``get`` hands out that same object while it lives, so there are
never two logs of one stream. Evicting writes nothing either; a log freed
without ``close`` leaves no clean-shutdown marker, which only means its tail
is scanned when it is next opened (recovery has to work without the marker
after a crash anyway).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from npstream.broker.storage.log import StreamLog

__all__ = ["OpenLogs"]


class OpenLogs:
    """Logs by name: an LRU of strong references over a weak index of every live log.

    Thread-safe. ``max_open_logs`` bounds the logs kept while idle; the logs in
    use by callers are not counted against it (like borrowed descriptors).
    """

    def __init__(self, max_open_logs: int) -> None:
        self.max_open_logs = max_open_logs
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, StreamLog] = OrderedDict()
        self._live: weakref.WeakValueDictionary[str, StreamLog] = weakref.WeakValueDictionary()

    def get(self, name: str) -> StreamLog | None:
        """The live log of ``name`` (marked most recently used), or None."""
        with self._lock:
            stream_log = self._live.get(name)
            if stream_log is not None:
                self._hold_locked(name, stream_log)
            return stream_log

    def add(self, name: str, stream_log: StreamLog) -> None:
        """Register a newly opened log as the most recently used."""
        with self._lock:
            self._live[name] = stream_log
            self._hold_locked(name, stream_log)

    def _hold_locked(self, name: str, stream_log: StreamLog) -> None:
        recent = self._recent
        if name in recent:
            recent.move_to_end(name)
            return
        recent[name] = stream_log
        while len(recent) > self.max_open_logs:
            recent.popitem(last=False)  # no longer held here; freed once unused

    def pop(self, name: str) -> StreamLog | None:
        """Forget ``name`` (being closed, dropped or repaired); its live log, if any."""
        with self._lock:
            self._recent.pop(name, None)
            return self._live.pop(name, None)

    def __contains__(self, name: str) -> bool:
        with self._lock:
            return self._live.get(name) is not None

    def live(self) -> list[StreamLog]:
        """Every log alive now: the held ones and those still in use elsewhere."""
        with self._lock:
            return list(self._live.values())

    def held_count(self) -> int:
        """Logs held by the LRU now (at most ``max_open_logs``)."""
        with self._lock:
            return len(self._recent)

    def clear(self) -> list[StreamLog]:
        """Forget everything; the logs that were alive (to be closed)."""
        with self._lock:
            logs = list(self._live.values())
            self._recent.clear()
            self._live = weakref.WeakValueDictionary()
            return logs

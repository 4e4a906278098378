"""The broker's read-only web console, served at ``/`` of the metrics HTTP port.

Plain files, no build step and nothing loaded from elsewhere (the page's
Content-Security-Policy allows only this port): ``static/index.html``, one
script ``console.js`` and one style sheet ``console.css``. The script asks
``/api/...`` (api.py) for JSON and draws the pages: streams, one stream with
its last messages and a time seek, groups, and charts of the publish rates
and group lags that history.py samples. docs/broker.md "Web console".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING

from npstream.broker.console.api import ConsoleApi
from npstream.broker.console.history import History, Sample

if TYPE_CHECKING:
    from npstream.broker.cluster.console_view import ClusterView
    from npstream.broker.groups.manager import GroupManager
    from npstream.broker.server.metrics import BrokerMetrics
    from npstream.broker.streams.registry import StreamRegistry

__all__ = ["Console"]

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


def _load_static() -> dict[str, tuple[str, bytes]]:
    """Every file of static/ by URL path, read once (no path from a request touches disk)."""
    files: dict[str, tuple[str, bytes]] = {}
    for entry in resources.files(__package__).joinpath("static").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _TYPES:
            files[f"/static/{entry.name}"] = (_TYPES[suffix], entry.read_bytes())
    files["/"] = files["/static/index.html"]
    return files


class Console:
    """The console's files, its API and the history sampler behind the charts."""

    def __init__(self, registry: StreamRegistry, groups: GroupManager | None,
                 metrics: BrokerMetrics, *, history_ms: int, series_max: int, auth: bool,
                 clock: Callable[[], float] = time.time,
                 cluster: ClusterView | None = None) -> None:
        """``cluster``: this member's view of the others (None: a broker of its own)."""
        self._registry = registry
        self._groups = groups
        self._metrics = metrics
        self._series_max = series_max
        self._files = _load_static()
        self.history = History(self._sample, history_ms / 1000, clock)
        self._api = ConsoleApi(registry, groups, metrics, self.history, auth=auth, clock=clock,
                               cluster=cluster)

    def start(self) -> Console:
        self.history.start()
        return self

    def close(self) -> None:
        self.history.close()

    def static(self, path: str) -> tuple[str, bytes] | None:
        return self._files.get(path)

    def api(self, path: str, query: dict[str, str],
            readable: Callable[[str], bool], token: bytes | None = None) -> tuple[int, object]:
        return self._api(path, query, readable, token)

    def _sample(self) -> Sample:
        """End offsets and reads of open streams, lags of groups (each up to the cap)."""
        logs = self._registry.open_logs()[: self._series_max]
        sample = Sample(streams={log.name: log.end_offset for log in logs},
                        outs={log.name: self._metrics.activity(log.name).messages_out
                              for log in logs})
        if self._groups is not None:
            statuses = self._groups.statuses(limit=self._series_max)[: self._series_max]
            sample.groups = {(g.stream, g.group): g.lag for g in statuses}
        return sample

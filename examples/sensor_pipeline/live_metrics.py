"""The tutorial's live processing metrics for the Spark sensor pipeline, over HTTP.

The seed tutorial's processor counts events received, processed and dropped,
windows emitted and backpressure events, and serves them with its uptime as
JSON at ``/metrics``. Here Spark does the processing, so the numbers come
from Spark itself, through a ``StreamingQueryListener`` on the driver:

- ``eventsReceived``: readings the query read from npstream, and
  ``eventsProcessed``: those that passed the filter on their way to the
  windows, as the tutorial counts them (named observations,
  ``Dataset.observe``, count the rows before and after the filter);
- ``eventsDropped``: readings the filter dropped (no value, wrong unit) plus
  those the aggregation dropped as later than the watermark, as far as Spark
  reports them (``numRowsDroppedByWatermark``: counted after the partial
  aggregation, so a late reading may go uncounted); readings that do not fit
  the stream's schema never get here: the broker refuses them at publish (the
  producer counts them);
- ``windowsEmitted``: finished windows written to the sinks, by the tumbling
  query and, with ``--slide``, the sliding one (an observation on the
  aggregated rows);
- ``backpressureEvents``: micro-batches that could not take everything there
  was to read: admission control (``maxOffsetsPerTrigger``) left messages for
  later, seen as the source's ``latestOffset`` (the broker's end offsets) past
  the batch's ``endOffset``, plus batches that took longer than the trigger
  interval (the query falling behind its schedule);
- ``uptimeMs``, and ``eventsPerSecond`` = processed / uptime (the tutorial's
  report line).

Served at ``/metrics`` as the tutorial's JSON and at ``/metrics/prometheus`` in
the Prometheus text format (``sensor_events_received_total`` ...).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger("sensor-pipeline.metrics")

INPUT_OBSERVATION = "sensor_input"
VALID_OBSERVATION = "sensor_valid"
WINDOWS_OBSERVATION = "sensor_windows"

# name in the tutorial's JSON -> (Prometheus name, type, help)
PROMETHEUS = {
    "eventsReceived": ("sensor_events_received_total", "counter",
                       "Readings the query read from npstream"),
    "eventsProcessed": ("sensor_events_processed_total", "counter",
                        "Readings that reached a window"),
    "eventsDropped": ("sensor_events_dropped_total", "counter",
                      "Readings dropped: invalid, or later than the watermark"),
    "windowsEmitted": ("sensor_windows_emitted_total", "counter",
                       "Finished windows written to the sinks"),
    "backpressureEvents": ("sensor_backpressure_events_total", "counter",
                           "Micro-batches that left data for later or overran the trigger"),
    "uptimeMs": ("sensor_uptime_seconds", "gauge", "Seconds since the pipeline started"),
    "eventsPerSecond": ("sensor_events_per_second", "gauge",
                        "Processed readings per second of uptime"),
}


def observe_input(readings: DataFrame) -> DataFrame:
    """Count every reading read from the stream (before the filter)."""
    return readings.observe(INPUT_OBSERVATION, F.count(F.lit(1)).alias("received"))


def observe_valid(readings: DataFrame) -> DataFrame:
    """Count the readings the filter kept."""
    return readings.observe(VALID_OBSERVATION, F.count(F.lit(1)).alias("valid"))


def observe_windows(windows: DataFrame) -> DataFrame:
    """Count the finished windows a micro-batch emits (append mode: each once)."""
    return windows.observe(WINDOWS_OBSERVATION, F.count(F.lit(1)).alias("windows"))


class LiveMetrics:
    """The counters, fed by ``listener()`` and read by the HTTP server; thread-safe.

    ``source_query``: the query whose input is counted (the sliding-window
    variant reads the same readings again, so only one query counts them).
    """

    def __init__(self, source_query: str = "sensor-tumbling",
                 trigger_seconds: float | None = None) -> None:
        self.source_query = source_query
        self.trigger_ms = trigger_seconds * 1000 if trigger_seconds else None
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._counts = {"eventsReceived": 0, "eventsProcessed": 0, "eventsDropped": 0,
                        "windowsEmitted": 0, "backpressureEvents": 0}
        self._server: ThreadingHTTPServer | None = None
        self.url = ""
        self._last_batch: dict[str, int] = {}  # query run id -> last batch counted

    # ------------------------------------------------------------ counting

    def record(self, progress: Any) -> None:
        """Count one micro-batch's progress (a StreamingQueryProgress)."""
        observed = progress.observedMetrics or {}
        with self._lock:
            if progress.batchId <= self._last_batch.get(str(progress.id), -1):
                return  # counted already (the listener and catch_up both hand it in)
            self._last_batch[str(progress.id)] = progress.batchId
            windows = observed.get(WINDOWS_OBSERVATION)
            if windows is not None:
                self._counts["windowsEmitted"] += int(windows["windows"] or 0)
            if progress.name != self.source_query:
                return
            seen, kept = observed.get(INPUT_OBSERVATION), observed.get(VALID_OBSERVATION)
            late = sum(op.numRowsDroppedByWatermark or 0 for op in progress.stateOperators)
            if seen is not None:
                received = int(seen["received"] or 0)
                valid = int(kept["valid"] or 0) if kept is not None else received
                self._counts["eventsReceived"] += received
                self._counts["eventsProcessed"] += valid
                self._counts["eventsDropped"] += received - valid + late
            if _held_back(progress) or (self.trigger_ms is not None
                                        and progress.batchDuration > self.trigger_ms):
                self._counts["backpressureEvents"] += 1

    def catch_up(self, queries: list[Any]) -> None:
        """Count the batches of (stopped) queries the listener has not been told about.

        Spark hands progress to listeners asynchronously and holds back the
        progress of batches without data (``noDataProgressEventInterval``), so
        the last batches (the one that closes the last windows) may reach the
        listener late or never; the queries keep them in ``recentProgress``.
        """
        for query in queries:
            for progress in query.recentProgress:
                self.record(progress)

    def snapshot(self) -> dict[str, float]:
        """The tutorial's JSON: its six numbers, plus events per second."""
        with self._lock:
            data: dict[str, float] = dict(self._counts)
        uptime_ms = int((time.monotonic() - self.started) * 1000)
        data["uptimeMs"] = uptime_ms
        data["eventsPerSecond"] = round(data["eventsProcessed"] / max(uptime_ms / 1000, 1e-3), 3)
        return data

    def prometheus(self) -> str:
        data = self.snapshot()
        lines = []
        for key, (name, kind, text) in PROMETHEUS.items():
            value = data[key] / 1000 if key == "uptimeMs" else data[key]
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"

    def report(self) -> str:
        """The tutorial's console report."""
        m = self.snapshot()
        return "\n".join([
            f"=== Metrics ({m['uptimeMs'] / 1000:.0f}s uptime) ===",
            f" Received: {m['eventsReceived']}", f" Processed: {m['eventsProcessed']}",
            f" Dropped: {m['eventsDropped']}", f" Windows: {m['windowsEmitted']}",
            f" Backpressure: {m['backpressureEvents']}",
            f" Rate: {m['eventsPerSecond']:.1f} events/sec",
        ])

    def listener(self) -> StreamingQueryListener:
        return _Listener(self)

    # ------------------------------------------------------------ serving

    def serve(self, host: str = "127.0.0.1", port: int = 9090) -> str:
        """Serve /metrics (JSON) and /metrics/prometheus; returns the JSON endpoint's URL."""
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0].rstrip("/")
                if path == "/metrics":
                    body, kind = json.dumps(metrics.snapshot()).encode(), "application/json"
                elif path == "/metrics/prometheus":
                    body, kind = metrics.prometheus().encode(), "text/plain; version=0.0.4"
                else:
                    self.send_error(404, "try /metrics or /metrics/prometheus")
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://{host}:{self._server.server_port}/metrics"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _held_back(progress: Any) -> bool:
    """Whether the batch stopped short of the broker's end offsets (admission control)."""
    for source in progress.sources:
        try:
            end = json.loads(source.endOffset or "{}")
            latest = json.loads(source.latestOffset or "{}")
        except (TypeError, ValueError):
            continue
        if any(latest.get(stream, 0) > offset for stream, offset in end.items()):
            return True
    return False


class _Listener(StreamingQueryListener):
    def __init__(self, metrics: LiveMetrics) -> None:
        self._metrics = metrics

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        try:
            self._metrics.record(event.progress)
        except Exception:  # a metrics bug must not stop the query's listener bus
            log.exception("could not count a micro-batch's progress")

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass

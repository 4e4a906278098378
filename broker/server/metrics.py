"""Prometheus metrics of the broker, on their own registry and HTTP endpoint.

Counters carry no stream label, so their cost does not grow with the number
of streams. The per-stream end-offset gauge is computed at scrape time from
the logs opened since the broker started (no work on the publish path), and
only while there are at most ``metrics_stream_gauges_max`` of them: with ten
thousand busy streams a scrape would otherwise carry ten thousand series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from npstream.broker.streams.registry import StreamRegistry

__all__ = ["BrokerMetrics"]

# Append latency buckets (seconds): ack=write lands in the sub-millisecond
# buckets, ack=fsync around the flush interval (default 50 ms) and disk fsync.
APPEND_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                          0.25, 0.5, 1.0, 2.5, 5.0)


class _StreamCollector(Collector):
    """Stream count and, for few enough open streams, each one's end offset."""

    def __init__(self, streams: StreamRegistry, gauges_max: int) -> None:
        self._streams = streams
        self._gauges_max = gauges_max

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("npstream_streams", "Streams in the registry",
                                value=len(self._streams))
        logs = self._streams.open_logs()
        yield GaugeMetricFamily("npstream_open_streams",
                                "Streams whose log was opened since start", value=len(logs))
        if len(logs) > self._gauges_max:
            return
        family = GaugeMetricFamily("npstream_stream_end_offset",
                                   "Next offset to be written, per opened stream",
                                   labels=["stream"])
        for stream_log in logs:
            family.add_metric([stream_log.name], stream_log.end_offset)
        yield family

    def describe(self) -> list[Metric]:
        return []


class BrokerMetrics:
    """The broker's metric objects; other services may add theirs to ``registry``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.publish_requests = Counter("npstream_publish_requests",
                                        "Publish RPCs that stored data", registry=r)
        self.published_messages = Counter("npstream_published_messages",
                                          "Messages stored by Publish", registry=r)
        self.published_bytes = Counter(
            "npstream_published_bytes",
            "Arrow bytes of messages stored by Publish (value bytes for the messages field)",
            registry=r)
        self.duplicate_messages = Counter("npstream_duplicate_messages",
                                          "Published messages dropped as duplicates", registry=r)
        self.fetch_requests = Counter("npstream_fetch_requests", "Fetch RPCs served", registry=r)
        self.fetched_messages = Counter("npstream_fetched_messages",
                                        "Messages returned by Fetch", registry=r)
        self.fetched_bytes = Counter("npstream_fetched_bytes",
                                     "Arrow IPC bytes returned by Fetch", registry=r)
        self.located_messages = Counter(
            "npstream_located_messages",
            "Messages located for same-host readers (StreamReadService.Locate)", registry=r)
        self.append_latency = Histogram("npstream_append_latency_seconds",
                                        "Time to append one Publish request (until its ack)",
                                        buckets=APPEND_LATENCY_BUCKETS, registry=r)
        self.rpc_errors = Counter("npstream_rpc_errors", "RPCs that failed, by status code",
                                  labelnames=("code",), registry=r)
        self._http: WSGIServer | None = None

    def watch_streams(self, streams: StreamRegistry, gauges_max: int) -> None:
        self.registry.register(_StreamCollector(streams, gauges_max))

    def serve(self, host: str, port: int) -> int:
        """Start the /metrics HTTP endpoint; returns the bound port (port 0 picks one)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = server
        return int(server.server_port)

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def error_counter(self) -> Callable[[str], None]:
        """A callback counting failed RPCs by status name (used by broker/rpc/status.py)."""
        return lambda code: self.rpc_errors.labels(code=code).inc()

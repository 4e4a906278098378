"""Metrics computed when scraped: per-stream series, file handles, connections, memory.

Nothing here runs on the publish or fetch path. Per-stream series come from
the open logs' stats and the activity tallies of BrokerMetrics, and only
while at most ``metrics_stream_gauges_max`` streams are open (the module doc
of metrics.py says why); the broker-wide totals are always there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from npstream.broker.errors import BrokerError
from npstream.broker.server.heap import heap_usage

if TYPE_CHECKING:
    from npstream.broker.server.metrics import BrokerMetrics
    from npstream.broker.storage import Storage
    from npstream.broker.streams.registry import StreamRegistry

__all__ = ["ResourceCollector", "StreamCollector", "established_connections"]

log = logging.getLogger(__name__)

_TCP_ESTABLISHED = "01"


_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def established_connections(port: int, tables: tuple[str, ...] = _TCP_TABLES) -> int | None:
    """TCP connections in state ESTABLISHED whose local port is ``port``; None off Linux.

    gRPC's Python server has no API for its connections; the kernel's socket
    tables do. The broker's listening port is its own (no SO_REUSEPORT), so
    every established socket on it is one client connection.
    """
    found = False
    count = 0
    wanted = f"{port:04X}"
    for table in tables:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        found = True
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == _TCP_ESTABLISHED and (
                    fields[1].rsplit(":", 1)[-1] == wanted):
                count += 1
    return count if found else None


class StreamCollector(Collector):
    """Stream counts and totals; per open stream its offsets, size, age and traffic."""

    def __init__(self, streams: StreamRegistry, metrics: BrokerMetrics, gauges_max: int,
                 clock: Callable[[], float] = time.time) -> None:
        self._streams = streams
        self._metrics = metrics
        self._gauges_max = gauges_max
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("npstream_streams", "Streams in the registry",
                                value=len(self._streams))
        logs = sorted(self._streams.open_logs(), key=lambda stream_log: stream_log.name)
        yield GaugeMetricFamily("npstream_open_streams",
                                "Streams whose log was opened since start", value=len(logs))
        stats = []
        for stream_log in logs:
            try:
                stats.append((stream_log.name, stream_log.stats()))
            except (BrokerError, OSError) as exc:  # deleted or closed while scraping
                log.debug("no stats of stream '%s' for metrics: %s", stream_log.name, exc)
        yield GaugeMetricFamily("npstream_retained_bytes",
                                "Bytes of message data on disk, all open streams",
                                value=sum(s.bytes_on_disk for _, s in stats))
        if len(logs) > self._gauges_max:
            return
        now_ms = self._clock() * 1000
        label = ["stream"]
        gauges = {
            "start_offset": GaugeMetricFamily(
                "npstream_stream_start_offset", "First retained offset", labels=label),
            "end_offset": GaugeMetricFamily(
                "npstream_stream_end_offset", "Next offset to be written", labels=label),
            "retained_bytes": GaugeMetricFamily(
                "npstream_stream_retained_bytes", "Bytes of the stream's segment files",
                labels=label),
            "segments": GaugeMetricFamily(
                "npstream_stream_segments", "Segment files of the stream", labels=label),
            "age": GaugeMetricFamily(
                "npstream_stream_oldest_message_age_seconds",
                "Age of the first retained message (0 when the stream is empty)", labels=label),
        }
        counters = {
            "messages_in": CounterMetricFamily(
                "npstream_stream_messages_in",
                "Messages stored since start (Publish, PublishStream, sink commits)",
                labels=label),
            "bytes_in": CounterMetricFamily(
                "npstream_stream_bytes_in", "Arrow bytes of publishes stored since start",
                labels=label),
            "messages_out": CounterMetricFamily(
                "npstream_stream_messages_out",
                "Messages handed to readers since start (range reads, local reads, group "
                "pulls and deliveries)", labels=label),
            "bytes_out": CounterMetricFamily(
                "npstream_stream_bytes_out",
                "Stored bytes returned by range reads and located for local reads since start",
                labels=label),
        }
        for name, stat in stats:
            values = {
                "start_offset": stat.start_offset, "end_offset": stat.end_offset,
                "retained_bytes": stat.bytes_on_disk, "segments": stat.segment_count,
                "age": (max(0.0, (now_ms - stat.first_timestamp_ms) / 1000)
                        if stat.first_timestamp_ms and stat.end_offset > stat.start_offset
                        else 0.0),
            }
            for key, family in gauges.items():
                family.add_metric([name], values[key])
            activity = self._metrics.activity(name)
            for key, counter in counters.items():
                counter.add_metric([name], getattr(activity, key))
        yield from gauges.values()
        yield from counters.values()

    def describe(self) -> list[Metric]:
        return []


class ResourceCollector(Collector):
    """File handles against their cap, client connections, memory against its budgets.

    The publish memory budget's use is rpc/budget.py's own gauge
    (``npstream_publish_bytes_in_flight``); its limit is exported here.
    """

    def __init__(self, storage: Storage, grpc_port: Callable[[], int],
                 retain_freed_memory: int, publish_bytes_limit: int = 0) -> None:
        self._storage = storage
        self._grpc_port = grpc_port
        self._retain = retain_freed_memory
        self._publish_limit = publish_bytes_limit

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "npstream_open_files", "Message-data file descriptors open now (the LRU cache)",
            value=self._storage.open_files())
        yield GaugeMetricFamily(
            "npstream_open_files_limit", "max_open_files: the cap of that cache",
            value=self._storage.settings.max_open_files)
        port = self._grpc_port()
        connections = established_connections(port) if port else None
        if connections is not None:
            yield GaugeMetricFamily("npstream_connections",
                                    "Client TCP connections to the gRPC port",
                                    value=connections)
        heap = heap_usage()
        if heap is not None:
            yield GaugeMetricFamily("npstream_memory_heap_used_bytes",
                                    "Heap bytes allocated (glibc mallinfo2)",
                                    value=heap.used_bytes)
            yield GaugeMetricFamily(
                "npstream_memory_heap_free_bytes",
                "Freed heap bytes kept for reuse instead of returned to the kernel",
                value=heap.free_bytes)
        yield GaugeMetricFamily(
            "npstream_memory_heap_free_limit_bytes",
            "retain_freed_memory: how much freed heap the broker may keep (0: glibc default)",
            value=self._retain)
        yield GaugeMetricFamily(
            "npstream_publish_bytes_in_flight_limit",
            "max_publish_bytes_in_flight: the publish memory budget (0: no limit)",
            value=self._publish_limit)

    def describe(self) -> list[Metric]:
        return []


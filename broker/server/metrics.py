"""Prometheus metrics of the broker, on their own registry; per-stream activity tallies.

Counters updated on the hot paths carry no stream label, so their cost does
not grow with the number of streams. What operators need per stream
(messages and bytes in and out, offsets, sizes) is either computed when
scraped from the logs (metric_collectors.py: no work on the publish path)
or kept in a plain per-stream tally (``StreamActivity``: a dict lookup and
four integer additions per call), and exported only while at most
``metrics_stream_gauges_max`` streams are open: with ten thousand busy
streams a scrape would otherwise carry ten thousand series of each metric.
The same tallies answer ``StreamService.StreamStats`` (``npstream top``)
and the web console, which ask for a few streams at a time and have no cap.

The registry is served by server/http.py (``/metrics``), which filters the
stream-labelled series by the caller's read right when auth is on
(``exposition``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest

__all__ = ["BrokerMetrics", "StreamActivity"]

# Publish latency buckets (seconds): ack=write lands in the sub-millisecond
# buckets, ack=fsync around the flush interval (default 50 ms) and disk fsync.
PUBLISH_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                           0.25, 0.5, 1.0, 2.5, 5.0)
# Fetch replies come from the page cache in well under a millisecond; larger
# ones and cold reads take longer.
FETCH_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                         0.1, 0.25, 0.5, 1.0)
# fdatasync: tens of microseconds on tmpfs or a write-back cache, milliseconds
# on SSDs, tens of milliseconds on spinning disks and some cloud volumes.
FSYNC_LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                         0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(slots=True)  # one per stream published to: small
class StreamActivity:
    """One stream's traffic since the broker started (kept under BrokerMetrics' lock).

    In: messages stored by Publish/PublishStream and Spark sink commits, and
    the Arrow bytes of the publishes. Out: messages handed to readers (Fetch,
    ReadRange, Locate for same-host reads, cursor-group Pull and shared-group
    deliveries, redeliveries included) and the stored bytes of range reads.
    """

    messages_in: int = 0
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0


class _Filtered:
    """A registry view without the stream-labelled samples the caller may not read."""

    def __init__(self, registry: CollectorRegistry, readable: Callable[[str], bool]) -> None:
        self._registry = registry
        self._readable = readable

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            if not any("stream" in sample.labels for sample in family.samples):
                yield family
                continue
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [s for s in family.samples
                            if "stream" not in s.labels or self._readable(s.labels["stream"])]
            yield kept


class BrokerMetrics:
    """The broker's metric objects; other services add theirs to ``registry``."""

    def __init__(self) -> None:
        # No `<counter>_created` series: they double a scrape for a start time that
        # process_start_time_seconds already gives (a process-wide switch; this
        # process is the broker).
        disable_created_metrics()
        self.registry = CollectorRegistry()
        self.started_ms = int(time.time() * 1000)
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
                                        "Messages returned by Fetch and ReadRange", registry=r)
        self.fetched_bytes = Counter("npstream_fetched_bytes",
                                     "Arrow IPC bytes returned by Fetch and ReadRange", registry=r)
        self.located_messages = Counter(
            "npstream_located_messages",
            "Messages located for same-host readers (StreamReadService.Locate)", registry=r)
        self.publish_latency = Histogram(
            "npstream_publish_latency_seconds",
            "Time from a Publish request's arrival to its ack, by ack mode (fsync, write)",
            labelnames=("ack",), buckets=PUBLISH_LATENCY_BUCKETS, registry=r)
        self.fetch_latency = Histogram(
            "npstream_fetch_latency_seconds",
            "Time to read and build one Fetch reply (a long poll's wait not included)",
            buckets=FETCH_LATENCY_BUCKETS, registry=r)
        self.fsync_latency = Histogram(
            "npstream_fsync_latency_seconds",
            "Duration of one fdatasync of a stream's segment file",
            buckets=FSYNC_LATENCY_BUCKETS, registry=r)
        self.rpc_errors = Counter("npstream_rpc_errors", "RPCs that failed, by status code",
                                  labelnames=("code",), registry=r)
        # process_cpu_seconds_total, process_resident_memory_bytes,
        # process_open_fds, process_max_fds, ... (Linux /proc).
        ProcessCollector(registry=r)
        self._lock = threading.Lock()
        self._activity: dict[str, StreamActivity] = {}

    # ------------------------------------------------------------ per-stream tallies

    def count_in(self, stream: str, messages: int, nbytes: int = 0) -> None:
        """Messages (and their bytes) stored in ``stream``."""
        with self._lock:
            tally = self._activity.get(stream)
            if tally is None:
                tally = self._activity[stream] = StreamActivity()
            tally.messages_in += messages
            tally.bytes_in += nbytes

    def count_out(self, stream: str, messages: int, nbytes: int = 0) -> None:
        """Messages (and their bytes) handed to readers of ``stream``."""
        with self._lock:
            tally = self._activity.get(stream)
            if tally is None:
                tally = self._activity[stream] = StreamActivity()
            tally.messages_out += messages
            tally.bytes_out += nbytes

    def activity(self, stream: str) -> StreamActivity:
        """A copy of the stream's tally (zeros for a stream without traffic since start)."""
        with self._lock:
            tally = self._activity.get(stream)
            return StreamActivity() if tally is None else StreamActivity(
                tally.messages_in, tally.bytes_in, tally.messages_out, tally.bytes_out)

    def forget_stream(self, stream: str) -> None:
        """Listener for deleted streams: a stream created again starts from zero."""
        with self._lock:
            self._activity.pop(stream, None)

    # ------------------------------------------------------------ observers

    def observe_fsync(self, seconds: float) -> None:
        self.fsync_latency.observe(seconds)

    def error_counter(self) -> Callable[[str], None]:
        """A callback counting failed RPCs by status name (used by broker/rpc/status.py)."""
        return lambda code: self.rpc_errors.labels(code=code).inc()

    # ------------------------------------------------------------ exposition

    def exposition(self, readable: Callable[[str], bool] | None = None) -> bytes:
        """The Prometheus text format; ``readable`` drops series of streams it refuses."""
        if readable is None:
            return bytes(generate_latest(self.registry))
        return bytes(generate_latest(_Filtered(self.registry, readable)))

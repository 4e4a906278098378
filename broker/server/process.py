"""The broker process: build the shared context, wire the services, serve, stop cleanly.

Start order: lock the data dir (two brokers on one data dir would corrupt
it), load the tokens (a bad tokens file refuses the start), open metadata
and storage, build the registry and context, register StreamService,
GroupService, SinkService (sink recovery runs inside its
``add_to_server``, before any client can call), health and reflection, bind,
start, then the metrics endpoint and the retention thread, and only then the
ready file. Stop order on SIGTERM/SIGINT: refuse new calls and wake long
polls, let in-flight calls finish (``shutdown_grace``), close groups and sink,
flush and fsync storage, checkpoint SQLite, exit 0. SIGHUP reloads the tokens
file (npstream.broker.auth.access) without dropping a connection.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from npstream.broker.auth.access import AccessControl
from npstream.broker.auth.tokens import TokensFileError
from npstream.broker.cluster import service as cluster_service
from npstream.broker.cluster.console_view import ClusterView
from npstream.broker.cluster.errors import EtcdError
from npstream.broker.cluster.membership import Membership
from npstream.broker.cluster.settings import default_advertised_address
from npstream.broker.cluster.stream_records import StreamRecorder
from npstream.broker.cluster.wiring import build_cluster, join_cluster, routing_interceptors
from npstream.broker.console import Console
from npstream.broker.groups import service as group_service
from npstream.broker.groups.manager import GroupManager
from npstream.broker.metadata import METADATA_FILE, Metadata
from npstream.broker.rpc import status as rpc_status
from npstream.broker.rpc.budget import PublishAdmission, PublishBudget
from npstream.broker.rpc.long_polls import ParkedPolls
from npstream.broker.server.config import BrokerConfig, is_loopback_host
from npstream.broker.server.context import BrokerContext, state_owners
from npstream.broker.server.errors import StartupError
from npstream.broker.server.http import HttpEndpoint
from npstream.broker.server.metric_collectors import ResourceCollector, StreamCollector
from npstream.broker.server.metrics import BrokerMetrics
from npstream.broker.server.tuning import MAX_PENDING_CALLS
from npstream.broker.sink import service as sink_service
from npstream.broker.storage import Storage
from npstream.broker.streams import reads as stream_reads
from npstream.broker.streams import service as stream_service
from npstream.broker.streams.consistency import inspect_metadata_files, start_data_dir_check
from npstream.broker.streams.registry import StreamRegistry
from npstream.proto import pb

__all__ = ["BrokerServer", "run"]


if TYPE_CHECKING:
    from npstream.broker.kafka.listener import KafkaListener

log = logging.getLogger("npstream.broker")

SERVICE_NAMES = tuple(
    pb.DESCRIPTOR.services_by_name[name].full_name
    for name in ("StreamService", "StreamReadService", "GroupService", "SinkService",
                 "ClusterService")
)
LOCK_FILE = "broker.lock"
# The unary calls that carry publish data: admitted against the publish memory
# budget before their requests are read (PublishStream's requests are admitted
# one by one by the stream service).
ADMITTED_METHODS = (
    f"/{pb.DESCRIPTOR.services_by_name['StreamService'].full_name}/Publish",
    f"/{pb.DESCRIPTOR.services_by_name['StreamService'].full_name}/PublishMany",
    f"/{pb.DESCRIPTOR.services_by_name['SinkService'].full_name}/Stage",
)

# HTTP/2 keepalive: clients with long-lived Subscribe streams may ping every
# 10 s even when idle; stricter server defaults would answer with GOAWAY.
KEEPALIVE_OPTIONS = (
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
)
# Calls gRPC core holds until the Python server takes them: above its defaults
# (1,000 soft, 3,000 hard), which cancel waiting calls unserved (server/tuning.py).
PENDING_CALL_OPTIONS = (
    ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
    ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
)


class Closeable(Protocol):
    def close(self) -> None: ...


def _lock_data_dir(data_dir: Path) -> IO[str]:
    handle = (data_dir / LOCK_FILE).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise StartupError(
            f"data dir {data_dir} is in use by another broker (pid {owner})"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


class BrokerServer:
    """One running broker; ``start()`` then ``stop()`` (both from the same thread)."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.stopping = threading.Event()
        self.address = ""
        self.metrics_address = ""
        self.console_address = ""
        self.port = 0
        self.kafka_address = ""
        self._http: HttpEndpoint | None = None
        self._kafka: KafkaListener | None = None
        self._console: Console | None = None
        self._membership: Membership | None = None
        self._closeables: list[Closeable] = []
        self._lock_handle: IO[str] | None = None
        self._server: grpc.Server | None = None
        self._health: health.HealthServicer | None = None
        self._retention: threading.Thread | None = None
        self._data_dir_check: threading.Thread | None = None
        self.ctx: BrokerContext | None = None

    # ------------------------------------------------------------ start

    def _build_context(self) -> BrokerContext:
        config = self.config
        data_dir = config.server.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_handle = _lock_data_dir(data_dir)
        try:
            access = AccessControl(config.server.auth_token, config.auth.tokens_path,
                                   config.cluster.cluster_token)
        except TokensFileError as exc:
            raise StartupError(str(exc)) from None
        found = inspect_metadata_files(data_dir)  # before opening changes them
        try:
            metadata = Metadata(data_dir, synchronous=config.storage.metadata_sync)
        except sqlite3.DatabaseError as exc:
            raise StartupError(f"metadata database {data_dir / METADATA_FILE} is unreadable "
                               f"({exc}); restore it from a backup (stream files are kept "
                               f"under {data_dir / 'streams'})") from None
        storage = Storage(config.storage)
        metrics = BrokerMetrics()
        listeners: list[Callable[[str], None]] = [metrics.forget_stream]
        registry = StreamRegistry(metadata, storage, config.streams,
                                  config.server.max_message_bytes_limit,
                                  on_stream_deleted=listeners)
        metrics.registry.register(StreamCollector(registry, metrics,
                                                  config.metrics.metrics_stream_gauges_max))
        metrics.registry.register(ResourceCollector(
            storage, lambda: self.port, config.server.retain_freed_memory,
            config.server.max_publish_bytes_in_flight))
        self._data_dir_check = start_data_dir_check(data_dir, found, registry.__contains__,
                                                    metrics.registry, self.stopping,
                                                    registry.end_floors)
        storage.set_sync_observer(metrics.observe_fsync)
        rpc_status.observe_errors(metrics.error_counter())
        budget = PublishBudget(config.server.max_publish_bytes_in_flight, metrics.registry)
        # Half the worker threads at most wait in long polls: the rest serve everything else.
        parked = ParkedPolls(config.server.max_workers // 2, metrics.registry)
        return BrokerContext(config=config, metadata=metadata, storage=storage,
                             registry=registry, metrics=metrics, on_stream_deleted=listeners,
                             state_owners=state_owners(metadata, registry),
                             stopping=self.stopping, access=access, publish_budget=budget,
                             parked_polls=parked)

    def _build_server(self, ctx: BrokerContext) -> grpc.Server:
        config = self.config.server
        interceptors: list[grpc.ServerInterceptor] = (
            [rpc_status.AuthInterceptor(ctx.access.authenticated)] if ctx.access.enabled
            else [])
        # After auth: a member routes (redirects, asks the others) only known callers.
        interceptors += routing_interceptors(ctx.cluster)
        if ctx.publish_budget.limit:  # first: admitted before anything reads the request
            interceptors.insert(0, PublishAdmission(ctx.publish_budget, ADMITTED_METHODS))
        server = grpc.server(
            ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="rpc"),
            interceptors=interceptors,
            options=[
                ("grpc.max_send_message_length", config.grpc_max_message_bytes),
                ("grpc.max_receive_message_length", config.grpc_max_message_bytes),
                ("grpc.so_reuseport", 0),  # a second broker on the port must fail, not share
                *KEEPALIVE_OPTIONS,
                *PENDING_CALL_OPTIONS,
            ],
            maximum_concurrent_rpcs=config.max_concurrent_rpcs or None,
        )
        # Every service registers the same way: add_to_server(server, ctx),
        # returning what must be closed at stop (or None).
        for add in (stream_service.add_to_server, stream_reads.add_to_server,
                    group_service.add_to_server, sink_service.add_to_server,
                    cluster_service.add_to_server):
            closeable = add(server, ctx)
            if closeable is not None:
                self._closeables.append(closeable)
        self._health = health.HealthServicer(experimental_non_blocking=True)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        for name in ("", *SERVICE_NAMES):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        return server

    def _bind(self, server: grpc.Server) -> int:
        config = self.config.server
        target = f"{config.host}:{config.port}"
        try:
            if config.tls_enabled:
                # With tls_client_ca_file, the TLS handshake itself refuses a client
                # without a certificate signed by that CA (mutual TLS).
                client_ca = (Path(config.tls_client_ca_file).read_bytes()
                             if config.tls_client_ca_file else None)
                credentials = grpc.ssl_server_credentials(
                    [(Path(config.tls_key_file).read_bytes(),
                      Path(config.tls_cert_file).read_bytes())],
                    root_certificates=client_ca,
                    require_client_auth=client_ca is not None,
                )
                port = server.add_secure_port(target, credentials)
            else:
                port = server.add_insecure_port(target)
        except RuntimeError as exc:
            raise StartupError(f"cannot listen on {target}: {exc} (port in use?)") from None
        if port == 0:
            raise StartupError(f"cannot listen on {target} (port in use?)")
        return port

    def _retention_loop(self) -> None:
        assert self.ctx is not None
        interval = self.config.storage.retention_check_interval_ms / 1000
        while not self.stopping.wait(interval):
            try:
                self.ctx.storage.enforce_retention()
            except Exception:
                log.exception("retention pass failed; retrying in %.1fs", interval)

    def start(self) -> None:
        self.ctx = self._build_context()
        self.ctx.cluster = build_cluster(self.config, self.ctx.registry.__contains__,
                                         self.ctx.access)
        server = self._build_server(self.ctx)
        port = self._bind(server)
        self._server = server
        server.start()
        server_config, metrics_config = self.config.server, self.config.metrics
        self.address = f"{server_config.host}:{port}"
        self.port = port
        if self.config.cluster.coordinated:
            self._join(port)
        if metrics_config.metrics_port is not None:
            self._serve_http(self.ctx)
        if self.config.kafka.kafka_port is not None:
            self._serve_kafka(self.ctx)
        self._retention = threading.Thread(target=self._retention_loop, name="retention",
                                           daemon=True)
        self._retention.start()
        self.ctx.access.start()
        tls = "off"
        if server_config.tls_enabled:
            tls = "on, client certificates required" if server_config.tls_client_ca_file else "on"
        log.info(
            "npstream broker serving on %s (tls=%s, auth=%s) data_dir=%s metrics=%s "
            "console=%s kafka=%s streams=%d",
            self.address, tls, self.ctx.access.describe(), server_config.data_dir.resolve(),
            self.metrics_address or "off", self.console_address or "off",
            self.kafka_address or "off",
            len(self.ctx.registry),
        )
        if self.ctx.cluster.enabled:
            log.info("cluster member %s of %d: %s (peer timeout %d ms)",
                     self.ctx.cluster.identity, len(self.ctx.cluster.members),
                     ", ".join(self.ctx.cluster.members), self.config.cluster.peer_timeout_ms)
        if not (self.config.auth_enabled or server_config.tls_enabled
                or is_loopback_host(server_config.host)):  # allowed by allow_insecure
            log.warning("serving without authentication or TLS on %s (allow_insecure = true): "
                        "anyone who can reach it may read, write and delete every stream",
                        self.address)

    def _join(self, port: int) -> None:
        """Register in etcd ([cluster] etcd); StartupError when etcd refuses or is away."""
        assert self.ctx is not None
        ctx, cluster, server_config = self.ctx, self.config.cluster, self.config.server
        address = cluster.advertised_address or default_advertised_address(
            server_config.host, port)
        try:
            self._membership = join_cluster(
                self.config, ctx.cluster, address, server_config.data_dir,
                ctx.registry.matching)
        except EtcdError as exc:
            raise StartupError(f"cannot join cluster {cluster.cluster_name!r} in etcd: "
                               f"{exc}") from None
        recorder = StreamRecorder(ctx.cluster)
        ctx.registry.add_created_listener(recorder.created)
        ctx.on_stream_deleted.append(recorder.deleted)
        self._closeables.append(recorder)

    def _serve_http(self, ctx: BrokerContext) -> None:
        """The metrics endpoint and, unless ``console = false``, the web console."""
        config, server_config = self.config.metrics, self.config.server
        assert config.metrics_port is not None
        if config.console:
            groups = next((c for c in self._closeables if isinstance(c, GroupManager)), None)
            self._console = Console(
                ctx.registry, groups, ctx.metrics, history_ms=config.console_history_ms,
                series_max=max(config.metrics_stream_gauges_max,
                               config.metrics_group_gauges_max),
                auth=ctx.access.enabled,
                cluster=ClusterView(ctx.cluster) if ctx.cluster.enabled else None).start()
        tls = ((server_config.tls_cert_file, server_config.tls_key_file)
               if server_config.tls_enabled else None)
        self._http = HttpEndpoint(ctx.metrics, ctx.access, self._console, tls)
        try:
            port = self._http.serve(config.metrics_host, config.metrics_port)
        except OSError as exc:
            raise StartupError(f"cannot serve metrics on {config.metrics_host}:"
                               f"{config.metrics_port}: {exc}") from None
        host = f"[{config.metrics_host}]" if ":" in config.metrics_host else config.metrics_host
        base = f"{self._http.scheme}://{host}:{port}"
        self.metrics_address = f"{base}/metrics"
        self.console_address = f"{base}/" if self._console is not None else ""

    def _serve_kafka(self, ctx: BrokerContext) -> None:
        """The Kafka protocol listener on ``host`` (npstream.broker.kafka, docs/kafka.md)."""
        config, host = self.config.kafka, self.config.server.host
        assert config.kafka_port is not None
        if ctx.access.enabled or self.config.server.tls_enabled:
            raise StartupError("[kafka] port is set with auth or TLS on, and the Kafka listener "
                               "serves neither SASL nor TLS yet (docs/kafka.md): set "
                               "kafka_port = 0 or serve without auth and TLS")
        # Imported here: the codecs (cramjam, zstandard) load only when Kafka is served.
        from npstream.broker.kafka.listener import KafkaListener

        self._kafka = KafkaListener(ctx, host, config.kafka_port)
        try:
            port = self._kafka.start()
        except OSError as exc:
            self._kafka = None
            raise StartupError(f"cannot serve Kafka on {host}:{config.kafka_port}: "
                               f"{exc}") from None
        self.kafka_address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def reload_tokens(self) -> None:
        """SIGHUP: reload the tokens file on the watcher thread (signal-safe)."""
        if self.ctx is not None:
            self.ctx.access.request_reload()

    # ------------------------------------------------------------ stop

    def stop(self) -> None:
        """Graceful stop; safe to call on a partly started broker."""
        started = time.monotonic()
        self.stopping.set()
        if self.ctx is not None:
            self.ctx.parked_polls.wake_all()  # they answer now, not at their next look
        if self._health is not None:
            self._health.enter_graceful_shutdown()
        if self._kafka is not None:
            self._kafka.stop()
        if self._server is not None:
            self._server.stop(self.config.server.shutdown_grace_ms / 1000).wait()
        drained = time.monotonic()
        if self._membership is not None:
            self._membership.stop()
        if self._retention is not None:
            self._retention.join(timeout=30)
        if self._data_dir_check is not None:
            self._data_dir_check.join(timeout=30)
        if self._http is not None:
            self._http.stop()
        if self._console is not None:
            self._console.close()
        if self.ctx is not None:
            self.ctx.access.close()
            self.ctx.cluster.close()
        for closeable in reversed(self._closeables):
            try:
                closeable.close()
            except Exception:
                log.exception("closing %r failed", closeable)
        ctx = self.ctx
        storage_started = time.monotonic()
        if ctx is not None:
            ends = {stream_log.name: stream_log.end_offset
                    for stream_log in ctx.storage.live_logs()}
            ctx.storage.close()  # fsyncs them: the ends are durable before they are recorded
            try:
                ctx.registry.record_end_floors(ends)
            except Exception:
                log.exception("recording the streams' end offsets at stop failed")
        storage_s = time.monotonic() - storage_started
        if ctx is not None:
            ctx.metadata.checkpoint()
            ctx.metadata.close()
            rpc_status.observe_errors(None)
        if self._lock_handle is not None:
            self._lock_handle.close()
        log.info("npstream broker stopped (%s, data_dir=%s): calls drained in %.2fs, "
                 "storage flushed and closed in %.2fs, total %.2fs",
                 self.address or "not serving", self.config.server.data_dir.resolve(),
                 drained - started, storage_s, time.monotonic() - started)


def _write_ready_file(path: Path, address: str) -> None:
    """Atomically, so a reader never sees a half-written address."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(address)
    tmp.replace(path)


def run(config: BrokerConfig, ready_file: Path | None = None) -> int:
    """Serve until SIGTERM/SIGINT; 0 after a clean stop, 1 when the broker cannot start."""
    stop_requested = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop_requested.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    broker = BrokerServer(config)
    # SIGHUP's default would end the process; here it reloads the tokens file.
    signal.signal(signal.SIGHUP, lambda _signum, _frame: broker.reload_tokens())
    try:
        broker.start()
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        broker.stop()
        return 1
    except Exception:
        log.exception("cannot start: unexpected error")
        broker.stop()
        return 1
    if ready_file is not None:
        _write_ready_file(ready_file, broker.address)
    while not stop_requested.wait(0.5):
        pass
    broker.stop()
    if ready_file is not None:
        ready_file.unlink(missing_ok=True)
    return 0

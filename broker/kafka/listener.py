"""The Kafka port: a TCP listener beside gRPC, one thread per connection.

A Kafka client pipelines requests on a connection and expects the responses
in request order; one thread reading, answering and writing in turn gives
that order without bookkeeping. A frame that does not decode, an oversized
size prefix or an API this broker does not serve closes the connection, as
Kafka does (the client reconnects and asks ApiVersions again).
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading

from npstream.broker.kafka.errors import CodecError
from npstream.broker.kafka.handlers import KafkaHandlers
from npstream.broker.kafka.protocol import decode_request
from npstream.broker.kafka.tuning import MAX_FRAME_BYTES
from npstream.broker.server.context import BrokerContext

__all__ = ["KafkaListener"]

log = logging.getLogger("npstream.broker.kafka")


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    handlers: KafkaHandlers


class _Connection(socketserver.BaseRequestHandler):
    server: _Server

    def _read_exact(self, n: int) -> bytes | None:
        chunks: list[bytes] = []
        while n:
            chunk = self.request.recv(min(n, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = "{}:{}".format(*self.client_address[:2])
        handlers = self.server.handlers
        try:
            while not handlers.stopping.is_set():
                prefix = self._read_exact(4)
                if prefix is None:
                    return
                size = int.from_bytes(prefix, "big", signed=True)
                if not 0 < size <= MAX_FRAME_BYTES:
                    log.warning("kafka: closing %s: frame size %d outside 1..%d", peer, size,
                                MAX_FRAME_BYTES)
                    return
                frame = self._read_exact(size)
                if frame is None:
                    return
                try:
                    request = decode_request(frame)
                    response = handlers.handle(request)
                except CodecError as exc:
                    log.warning("kafka: closing %s: unreadable request: %s", peer, exc)
                    return
                except Exception:  # a bug or the broker stopping: this connection only
                    log.exception("kafka: closing %s: the request failed", peer)
                    return
                if response is not None:
                    sock.sendall(response)
        except OSError:
            return  # the client went away


class KafkaListener:
    """The Kafka listener of one broker; ``start`` binds and serves, ``stop`` closes."""

    def __init__(self, ctx: BrokerContext, host: str, port: int) -> None:
        self._ctx = ctx
        self._host = host
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self) -> int:
        """Bind and serve; the port bound. OSError when the port cannot be had."""
        server = _Server((self._host, self._port), _Connection, bind_and_activate=True)
        self.port = server.server_address[1]
        settings = self._ctx.config.kafka
        advertised = settings.kafka_advertised_address or f"{self._host}:{self.port}"
        server.handlers = KafkaHandlers(self._ctx, advertised)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="kafka-listener",
                                        kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

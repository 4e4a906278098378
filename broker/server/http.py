"""The broker's HTTP port: ``/metrics`` for Prometheus and the read-only web console at ``/``.

One small threaded WSGI server (stdlib wsgiref, as prometheus_client's own
endpoint), so the console needs no second port and no web framework.

Auth: with auth off, everything is open (the port binds to loopback by
default). With auth on (``auth_token`` or a tokens file), every data request
carries a token, the same tokens as gRPC, and sees only the streams that
token may read:

- ``/metrics`` takes ``Authorization: Bearer <token>`` (Prometheus'
  ``authorization`` scrape setting) or HTTP basic auth with the token as the
  password (or as the user name with an empty password: ``curl -u TOKEN:``),
  and answers 401 with a basic-auth challenge otherwise. Series labelled with
  a stream the token may not read are left out; broker-wide totals stay.
- ``/api/...`` (the console's JSON) takes the bearer token only and answers
  401 without a challenge (no browser pop-up): the console page asks for the
  token itself and keeps it in the tab's sessionStorage.
- The console's page, script and style sheet hold no data and need no token.

With TLS on (``tls_cert_file``) the port serves HTTPS with the broker's
certificate, so tokens never cross the network in clear text; client
certificates are not asked for here (browsers and scrapers rarely have
them), the token is the credential.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

if TYPE_CHECKING:
    from npstream.broker.auth.access import AccessControl
    from npstream.broker.server.metrics import BrokerMetrics

__all__ = ["ConsoleApp", "HttpEndpoint", "request_token"]

log = logging.getLogger(__name__)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
Readable = Callable[[str], bool]

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
# Nothing the console loads may come from anywhere but this port.
CONSOLE_HEADERS = [
    ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; "
                                "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
]


class ConsoleApp(Protocol):
    """What the HTTP port asks the web console (npstream.broker.console)."""

    def static(self, path: str) -> tuple[str, bytes] | None:
        """(content type, bytes) of a page or asset; None when there is no such file."""

    def api(self, path: str, query: dict[str, str],
            readable: Readable, token: bytes | None = None) -> tuple[int, object]:
        """(HTTP status, JSON-ready body) of an ``/api/...`` request.

        ``token``: the caller's, for what the console asks other cluster members."""


def request_token(header: str | None) -> bytes | None:
    """The token of an Authorization header: bearer, or basic auth's password (else user)."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value.encode()
    if scheme.lower() == "basic" and value:
        try:
            user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return (password or user).encode() or None
    return None


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr: scrapes every few seconds would drown the broker's log."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class HttpEndpoint:
    """The WSGI application and its server; ``serve`` then ``stop``."""

    def __init__(self, metrics: BrokerMetrics, access: AccessControl,
                 console: ConsoleApp | None = None,
                 tls: tuple[str, str] | None = None) -> None:
        self._metrics = metrics
        self._access = access
        self._console = console
        self._tls = tls
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def scheme(self) -> str:
        return "https" if self._tls else "http"

    # ------------------------------------------------------------ serving

    def serve(self, host: str, port: int) -> int:
        """Start serving in a daemon thread; returns the bound port (0 picks one)."""
        family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("HttpServer", (_Server,), {"address_family": family})
        server: WSGIServer = make_server(host, port, self, server_class=server_class,
                                         handler_class=_QuietHandler)
        if self._tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(self._tls[0], self._tls[1])
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="http",
                                        daemon=True)
        self._thread.start()
        return int(server.server_port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ------------------------------------------------------------ WSGI

    def __call__(self, environ: dict[str, Any],
                 start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return _reply(start_response, HTTPStatus.METHOD_NOT_ALLOWED, "text/plain",
                          b"read-only: GET only\n", [("Allow", "GET, HEAD")])
        token = request_token(environ.get("HTTP_AUTHORIZATION"))
        try:
            if path == "/metrics":
                return self._metrics_page(token, start_response)
            if self._console is not None and path.startswith("/api/"):
                return self._api(path, environ.get("QUERY_STRING", ""), token, start_response)
            if self._console is not None:
                found = self._console.static(path)
                if found is not None:
                    return _reply(start_response, HTTPStatus.OK, found[0], found[1],
                                  CONSOLE_HEADERS)
        except Exception:  # a bug: logged once, answered 500, the server keeps serving
            log.exception("HTTP %s failed", path)
            return _reply(start_response, HTTPStatus.INTERNAL_SERVER_ERROR, "text/plain",
                          b"internal error (logged by the broker)\n")
        return _reply(start_response, HTTPStatus.NOT_FOUND, "text/plain", b"not found\n")

    def _metrics_page(self, token: bytes | None,
                      start_response: StartResponse) -> Iterable[bytes]:
        readable = self._access.reader_of(token)
        if readable is None:
            return _reply(start_response, HTTPStatus.UNAUTHORIZED, "text/plain",
                          b"a token is needed: Authorization: Bearer <token>, or basic auth "
                          b"with the token as the password\n",
                          [("WWW-Authenticate", 'Basic realm="npstream metrics"')])
        body = self._metrics.exposition(readable if self._access.enabled else None)
        return _reply(start_response, HTTPStatus.OK, PROMETHEUS_TEXT, body)

    def _api(self, path: str, query_string: str, token: bytes | None,
             start_response: StartResponse) -> Iterable[bytes]:
        assert self._console is not None
        readable = self._access.reader_of(token)
        body: object
        if readable is None:
            status, body = 401, {"error": "unauthenticated",
                                 "message": "this broker needs a token: enter one"}
        else:
            query = {k: v[-1] for k, v in parse_qs(query_string).items()}
            status, body = self._console.api(path, query, readable, token)
        data = json.dumps(body, separators=(",", ":"), default=str).encode()
        return _reply(start_response, HTTPStatus(status), "application/json", data,
                      [("Cache-Control", "no-store"), *CONSOLE_HEADERS])


def _reply(start_response: StartResponse, status: HTTPStatus, content_type: str,
           body: bytes, headers: list[tuple[str, str]] | None = None) -> list[bytes]:
    start_response(f"{status.value} {status.phrase}",
                   [("Content-Type", content_type), ("Content-Length", str(len(body))),
                    *(headers or [])])
    return [body]

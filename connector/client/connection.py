"""The gRPC channel to one broker: address, TLS, auth metadata, and retry with backoff.

TLS: ``tls=True`` verifies the broker with the system's roots, or with
``root_certificates``; ``client_cert`` and ``client_key`` (PEM bytes, both
or neither) present a client certificate, for a broker that requires one
(``tls_client_ca_file``, mutual TLS). Either implies TLS.

Everything that crosses the wire goes through ``Connection.call`` (unary; also
``call_serialized`` for requests already in wire bytes) or ``Connection.stream``
(bidirectional), each naming its method by the generated stub's attribute
(npstream.client.stubs), so the retry rules live in one place:

* ``UNAVAILABLE`` is retried with exponential backoff and full jitter until
  ``retry_deadline`` seconds have passed, then ``BrokerUnavailable`` is raised
  naming the address and the last gRPC detail, with the last error's ``code``
  and ``reason`` (e.g. SHUTTING_DOWN). A call still being retried after
  ``RETRY_NOTICE_AFTER_S`` logs a WARNING (address, attempt, next wait, the
  gRPC detail) at most once per ``RETRY_NOTICE_EVERY_S``, so a broker that is
  down or an address that is wrong is not a silent wait (the CLI prints it on
  stderr).
* A call marked ``idempotent=False`` (a Publish without ids on every message)
  is retried only when gRPC reports that it never reached the broker (the
  connection could not be established). If the connection broke while the call
  was in flight, the broker may or may not have stored it, so the error is
  raised at once and says so.
* ``RESOURCE_EXHAUSTED`` with reason OVERLOADED (the broker's publish memory
  budget is used up) is retried the same way, whether the call is idempotent
  or not, because the broker stored nothing of it; each wait is at least the
  ``x-npstream-retry-after-ms`` the broker sent. After ``retry_deadline`` the
  ``Overloaded`` error is raised.
* ``UNAVAILABLE`` with reason STREAM_MOVING (the stream is being moved to
  another broker of the cluster and takes no writes meanwhile) is retried
  like OVERLOADED, idempotent or not: the broker did nothing of it. Once the
  move is done the old broker redirects, which the client follows
  (npstream.client.routing).
* Every other status goes through ``npstream.errors.from_rpc_error``.
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import grpc

from npstream.client.stubs import Rpc, Stubs, path_of
from npstream.errors import (
    BrokerUnavailable,
    InvalidArgument,
    NpstreamError,
    Overloaded,
    StreamMoving,
    from_rpc_error,
)
from npstream.proto import metadata_keys
from npstream.proto.defaults import (
    BROKER_ADDRESS_ENV,
    DEFAULT_BROKER_ADDRESS,
    GRPC_MAX_MESSAGE_BYTES,
)

__all__ = [
    "DEFAULT_ADDRESS",
    "MAX_MESSAGE_BYTES",
    "Connection",
    "StreamingCall",
    "resolve_address",
]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- tuning
# Address used when neither the caller nor NPSTREAM_BROKER names one, and the
# channel's message size limit (both directions): the contract's, shared with
# the broker (npstream.proto.defaults).
DEFAULT_ADDRESS = DEFAULT_BROKER_ADDRESS
MAX_MESSAGE_BYTES = GRPC_MAX_MESSAGE_BYTES
# Our retry backoff: first sleep, growth factor and cap (seconds). Full jitter
# (sleep uniformly in [0, backoff]) keeps many clients from reconnecting in
# lockstep after a broker restart.
RETRY_INITIAL_BACKOFF_S = 0.05
RETRY_BACKOFF_MULTIPLIER = 2.0
RETRY_MAX_BACKOFF_S = 1.0
# gRPC's own reconnect backoff defaults to 1 s growing to 120 s; while it
# waits, calls fail fast, so a broker that is back after a restart would stay
# unreachable for seconds. Keep it short: a local broker is back quickly.
RECONNECT_INITIAL_BACKOFF_MS = 100
RECONNECT_MAX_BACKOFF_MS = 1000
# A call still retrying after this long says so (a WARNING log line), then at
# most once per RETRY_NOTICE_EVERY_S: waiting silently for retry_deadline
# (15 s by default) looks like a hang.
RETRY_NOTICE_AFTER_S = 1.0
RETRY_NOTICE_EVERY_S = 1.0
# Keepalive pings detect a dead broker on an idle connection (long polls).
KEEPALIVE_TIME_MS = 30_000
KEEPALIVE_TIMEOUT_MS = 10_000

# gRPC details that mean the call was never written to a connection.
_NOT_SENT_MARKERS = (
    "failed to connect to all addresses",
    "connections to all backends failing",
    "dns resolution failed",
    "name resolution",
    "empty address list",
)


# host:port with a DNS name or IPv4 address, or [IPv6]:port.
_HOST_PORT = re.compile(r"(\[[0-9a-fA-F:.%\w]+\]|[A-Za-z0-9._-]+):(\d{1,5})")
# gRPC's own target schemes (dns:///host:port, unix:/path, ...), passed through as they are.
_GRPC_SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")
_ADDRESS_FORMS = ("use host:port (e.g. localhost:7070, [::1]:7070) or a gRPC target "
                  "(dns:///host:7070, unix:/path/to.sock)")


def resolve_address(address: str | None) -> str:
    """The broker address to use: the argument, else $NPSTREAM_BROKER, else localhost:7070.

    Checked here, because gRPC takes almost anything: ``"localhost"`` alone
    would dial port 443 and fail only after the retry deadline.
    """
    chosen = (address or os.environ.get(BROKER_ADDRESS_ENV) or DEFAULT_ADDRESS).strip()
    if not chosen:
        raise InvalidArgument(f"empty broker address; {_ADDRESS_FORMS}")
    if chosen.lower().startswith(_GRPC_SCHEMES):
        return chosen
    match = _HOST_PORT.fullmatch(chosen)
    if match is None:
        problem = ("no port" if ":" not in chosen.replace("::", "") or chosen.endswith("]")
                   else "not host:port")
        raise InvalidArgument(f"invalid broker address {chosen!r}: {problem}; {_ADDRESS_FORMS}")
    if not 0 < int(match.group(2)) < 65536:
        raise InvalidArgument(f"invalid broker address {chosen!r}: port {match.group(2)} is "
                              "not within 1..65535")
    return chosen


class _HasDetails(Protocol):
    """What ``never_reached_broker`` reads: a failed call's gRPC detail."""

    def details(self) -> str | None: ...


def never_reached_broker(exc: _HasDetails) -> bool:
    """True when gRPC says the call failed before any byte reached a broker.

    ``exc`` is a ``grpc.RpcError`` or a ``StreamingCall`` (the detail of its call).
    """
    details = (exc.details() or "").lower() if hasattr(exc, "details") else ""
    return any(marker in details for marker in _NOT_SENT_MARKERS)


class Connection:
    """One channel to one broker, with the stubs of every service and the retry loop."""

    def __init__(
        self,
        address: str | None = None,
        token: str | None = None,
        *,
        tls: bool = False,
        root_certificates: bytes | None = None,
        client_cert: bytes | None = None,
        client_key: bytes | None = None,
        timeout: float = 30.0,
        retry_deadline: float = 15.0,
    ) -> None:
        if (client_cert is None) != (client_key is None):
            raise InvalidArgument(
                "client_cert and client_key go together: pass both (PEM bytes of the client "
                "certificate and of its private key) or neither")
        if timeout <= 0:
            raise InvalidArgument(f"timeout must be > 0 seconds, got {timeout!r}")
        if retry_deadline < 0:
            raise InvalidArgument(
                f"retry_deadline must be >= 0 seconds, got {retry_deadline!r}")
        self.address = resolve_address(address)
        self.timeout = float(timeout)
        self.retry_deadline = float(retry_deadline)
        self._metadata: tuple[tuple[str, str], ...] = (
            ((metadata_keys.AUTHORIZATION, f"Bearer {token}"),) if token else ()
        )
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.initial_reconnect_backoff_ms", RECONNECT_INITIAL_BACKOFF_MS),
            ("grpc.min_reconnect_backoff_ms", RECONNECT_INITIAL_BACKOFF_MS),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_MAX_BACKOFF_MS),
            ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ]
        if tls or root_certificates is not None or client_cert is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=root_certificates, private_key=client_key,
                certificate_chain=client_cert)
            self._channel = grpc.secure_channel(self.address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(self.address, options=options)
        self.stubs = Stubs(self._channel)
        self._raw_streams: dict[str, Any] = {}
        self._raw_unaries: dict[str, Any] = {}
        self._raw_replies: dict[str, Any] = {}
        self._closed = False

    # ------------------------------------------------------------ calls

    def _method(self, rpc: Rpc | str) -> tuple[Any, str]:
        """The stub method ``rpc`` names (npstream.client.stubs) and its name."""
        if self._closed:
            raise NpstreamError(f"client for {self.address} is closed")
        return self.stubs.method(rpc)

    def call(
        self,
        rpc: Rpc | str,
        request: Any,
        *,
        timeout: float | None = None,
        idempotent: bool = True,
    ) -> Any:
        """Send one unary call; retry UNAVAILABLE as the module docstring says.

        ``rpc``: the stub method, ``lambda s: s.StreamService.Fetch``
        (npstream.client.stubs), or its name ``"StreamService.Fetch"``.
        """
        method, name = self._method(rpc)
        per_call = self.timeout if timeout is None else timeout
        return self._retrying(
            name, lambda: method(request, timeout=per_call, metadata=self._metadata), idempotent)

    def _retrying(self, rpc: str, send: Callable[[], Any], idempotent: bool) -> Any:
        """``send()`` until it succeeds, retrying UNAVAILABLE; the retry rules of ``call``."""
        deadline = time.monotonic() + self.retry_deadline
        notice = _RetryNotice(rpc, self.address, self.retry_deadline)
        backoff = RETRY_INITIAL_BACKOFF_S
        attempt = 0
        while True:
            attempt += 1
            try:
                return send()
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    error = from_rpc_error(exc, self.address)
                    if not isinstance(error, Overloaded):
                        raise error from None
                    backoff = self._wait_overloaded(notice, error, deadline, attempt, backoff)
                    continue
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise from_rpc_error(exc, self.address) from None
                moving = from_rpc_error(exc, self.address)
                if isinstance(moving, StreamMoving):
                    backoff = self._wait_overloaded(notice, moving, deadline, attempt, backoff)
                    continue
                detail = exc.details() or ""
                if not idempotent and not never_reached_broker(exc):
                    error = from_rpc_error(exc, self.address)
                    raise BrokerUnavailable(
                        f"{error} (during {rpc}; the request may "
                        "or may not have been stored: give every message an id to make "
                        "retries safe)", code=error.code, reason=error.reason,
                    ) from None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    error = from_rpc_error(exc, self.address)
                    raise BrokerUnavailable(
                        f"{error} (gave up after {attempt} "
                        f"attempt(s) over {self.retry_deadline:g}s)",
                        code=error.code, reason=error.reason,
                    ) from None
                sleep = min(random.uniform(0, backoff), remaining)
                notice.retrying("is unavailable", attempt, sleep, detail)
                time.sleep(sleep)
                backoff = min(backoff * RETRY_BACKOFF_MULTIPLIER, RETRY_MAX_BACKOFF_S)

    def _wait_overloaded(self, notice: _RetryNotice, error: Overloaded | StreamMoving,
                         deadline: float, attempt: int, backoff: float) -> float:
        """Sleep before resending a call the broker refused (overloaded, stream moving).

        Returns the next backoff.

        Raises ``error`` (noting the attempts) when the retry deadline would pass.
        """
        remaining = deadline - time.monotonic()
        sleep = max(error.retry_after, random.uniform(0, backoff))
        if sleep >= remaining:
            why = ("the broker stayed overloaded" if isinstance(error, Overloaded)
                   else "the stream was being moved")
            error.add_note(f"gave up after {attempt} attempt(s) over {self.retry_deadline:g}s "
                           f"while {why}")
            raise error from None
        notice.retrying("is overloaded" if isinstance(error, Overloaded)
                        else "is moving the stream", attempt, sleep, str(error))
        time.sleep(sleep)
        return min(backoff * RETRY_BACKOFF_MULTIPLIER, RETRY_MAX_BACKOFF_S)

    def stream(
        self, rpc: Rpc | str, request_iterator: Iterator[Any], *, timeout: float | None = None
    ) -> StreamingCall:
        """Open a bidirectional streaming call (GroupService.Subscribe).

        Not retried: the caller owns the session state and reopens it.
        ``timeout`` None means no deadline (a subscription lives until cancelled).
        """
        method, _name = self._method(rpc)
        return StreamingCall(
            method(request_iterator, timeout=timeout, metadata=self._metadata), self.address
        )

    def server_stream(
        self, rpc: Rpc | str, request: Any, *, timeout: float | None = None
    ) -> StreamingCall:
        """Open a server-streaming call (StreamReadService.ReadRange); not retried."""
        method, _name = self._method(rpc)
        return StreamingCall(
            method(request, timeout=timeout, metadata=self._metadata), self.address
        )

    def call_serialized(
        self, rpc: Rpc | str, request: bytes, response_type: Any, *,
        timeout: float | None = None, idempotent: bool = True,
    ) -> Any:
        """Like ``call`` for a request that is already protobuf wire bytes (same retries).

        For unary hot paths whose request carries a big bytes field
        (SinkClient.stage: the Arrow data appended by npstream.proto.wire), so it
        is not copied into a message and serialized again. ``response_type``
        is the response message class.
        """
        _stub, name = self._method(rpc)  # same checks: known rpc, open client
        unary = self._raw_unaries.get(name)
        if unary is None:
            unary = self._channel.unary_unary(
                path_of(name), request_serializer=None,
                response_deserializer=response_type.FromString)
            self._raw_unaries[name] = unary
        per_call = self.timeout if timeout is None else timeout
        return self._retrying(
            name, lambda: unary(request, timeout=per_call, metadata=self._metadata), idempotent)

    def call_raw_reply(
        self, rpc: Rpc | str, request: Any, *, timeout: float | None = None,
        idempotent: bool = True,
    ) -> bytes:
        """Like ``call``, but the reply is left as its protobuf wire bytes (same retries).

        For unary hot paths whose reply carries a big bytes field
        (ReceiveBatch's Arrow deliveries): ``npstream.proto.wire.split_bytes_field``
        hands it out as a view, where parsing a message would copy it twice.
        """
        _stub, name = self._method(rpc)  # same checks: known rpc, open client
        unary = self._raw_replies.get(name)
        if unary is None:
            unary = self._channel.unary_unary(
                path_of(name), request_serializer=type(request).SerializeToString,
                response_deserializer=None)
            self._raw_replies[name] = unary
        per_call = self.timeout if timeout is None else timeout
        reply: bytes = self._retrying(
            name, lambda: unary(request, timeout=per_call, metadata=self._metadata), idempotent)
        return reply

    def stream_serialized(
        self, rpc: Rpc | str, request_iterator: Iterator[bytes], response_type: Any, *,
        timeout: float | None = None,
    ) -> StreamingCall:
        """Like ``stream`` for requests that are already protobuf wire bytes.

        For hot paths that build a request's bytes with fewer copies than
        protobuf can (publish_batch: batching.encode_publish_request).
        ``response_type`` is the response message class.
        """
        _stub, name = self._method(rpc)  # same checks: known rpc, open client
        multi = self._raw_streams.get(name)
        if multi is None:
            multi = self._channel.stream_stream(
                path_of(name), request_serializer=None,
                response_deserializer=response_type.FromString,
            )
            self._raw_streams[name] = multi
        return StreamingCall(
            multi(request_iterator, timeout=timeout, metadata=self._metadata), self.address
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._channel.close()


class _RetryNotice:
    """The log lines of one call's retries: DEBUG each, WARNING once it has lasted a while."""

    def __init__(self, rpc: str, address: str, retry_deadline: float) -> None:
        self.rpc = rpc
        self.address = address
        self.retry_deadline = retry_deadline
        self.started = time.monotonic()
        self.warned = -RETRY_NOTICE_EVERY_S

    def retrying(self, state: str, attempt: int, sleep: float, detail: str) -> None:
        now = time.monotonic()
        elapsed = now - self.started
        level = logging.DEBUG
        if elapsed >= RETRY_NOTICE_AFTER_S and now - self.warned >= RETRY_NOTICE_EVERY_S:
            level = logging.WARNING
            self.warned = now
        log.log(level, "broker at %s %s (%s, attempt %d, %.1fs of %gs): next attempt in "
                "%.1fs: %s", self.address, state, self.rpc, attempt, elapsed,
                self.retry_deadline, sleep, " ".join(detail.split()))


class StreamingCall:
    """A streaming call's responses with errors mapped through ``from_rpc_error``.

    Iterating yields the response messages. After ``cancel()`` iteration ends
    quietly instead of raising CANCELLED. Other attributes (``code()``,
    ``details()``, ``is_active()``, ``add_callback()``) are the gRPC call's.
    """

    def __init__(self, call: Any, address: str) -> None:
        self._call = call
        self._address = address
        self._cancelled = False

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._call)
        except grpc.RpcError as exc:
            if self._cancelled and exc.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise from_rpc_error(exc, self._address) from None

    def cancel(self) -> bool:
        self._cancelled = True
        return bool(self._call.cancel())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

"""Access control: the live tokens table, its reloads, and the one place rights are decided.

Two steps, as in HTTP: the auth interceptor (npstream.broker.rpc.status)
answers UNAUTHENTICATED to a call without a known token before any servicer
runs (``authenticated``), and each servicer asks ``require(context, stream,
right)`` at the point where it knows the stream, which raises
PermissionDeniedError naming the stream and the right. Servicers hold no
rules of their own: which right an RPC needs is written once, in the
servicer's call and in the table of docs/broker.md "Security".

A call is decided against the table in force when it asks, not the one of
when its connection opened: a reload (SIGHUP, or the tokens file changing:
its stat is polled every ``POLL_INTERVAL_S``) changes what every connected
client may do from its next call on (and a PublishStream from its next
request), without dropping a connection. A reload that fails keeps the
previous table and logs why at ERROR; only a broker start refuses a bad
file.

Without ``auth_token`` and ``tokens_file`` access control is off: no
interceptor is installed and ``require`` returns at once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Self

import grpc

from npstream.broker.auth.tokens import (
    Right,
    TokenGrant,
    TokensFileError,
    TokenTable,
    bearer_token,
)
from npstream.broker.auth.tuning import POLL_INTERVAL_S
from npstream.broker.errors import (
    InvalidArgumentError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from npstream.proto import metadata_keys
from npstream.proto.names import validate_stream_name

__all__ = ["AccessControl", "Right"]

log = logging.getLogger(__name__)

_Stamp = tuple[int, int, int] | None


def _stamp(path: Path | None) -> _Stamp:
    """What tells a changed file: inode (an editor's rename), size and mtime."""
    if path is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _authorization(context: grpc.ServicerContext) -> str | bytes | None:
    for key, value in context.invocation_metadata() or ():
        if key == metadata_keys.AUTHORIZATION:
            return value
    return None


class AccessControl:
    """The broker's tokens and rights; thread-safe, the table swapped whole on reload."""

    def __init__(self, auth_token: str = "", tokens_file: Path | None = None,
                 cluster_token: str = "") -> None:
        """Load the table now: TokensFileError (a refused start) for a bad tokens file.

        ``cluster_token`` (the members' own, tokens.py) turns nothing on by itself.
        """
        self.tokens_file = tokens_file
        self.enabled = bool(auth_token or tokens_file)
        self._auth_token = auth_token
        self._cluster_token = cluster_token if self.enabled else ""
        self._stamp = _stamp(tokens_file)
        self._table = TokenTable.build(auth_token, tokens_file, self._cluster_token)
        self._reload_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def __repr__(self) -> str:  # never the tokens
        return (f"AccessControl(enabled={self.enabled}, tokens={len(self._table)}, "
                f"tokens_file={self.tokens_file})")

    def describe(self) -> str:
        """For the start-up log line: what is on, and how many tokens (no secrets)."""
        if not self.enabled:
            return "off"
        parts = ["auth_token"] if self._auth_token else []
        if self._cluster_token:
            parts.append("cluster_token")
        if self.tokens_file is not None:
            count = len(self._table) - (1 if self._auth_token else 0) - (
                1 if self._cluster_token else 0)
            parts.append(f"tokens_file {self.tokens_file} ({count} token(s))")
        return "on: " + " + ".join(parts)

    # ------------------------------------------------------------ decisions

    def authenticated(self, header: str | bytes | None) -> bool:
        """Whether an ``authorization`` value carries a known token (the interceptor's test)."""
        return self._table.lookup(bearer_token(header)) is not None

    def grant_of(self, context: grpc.ServicerContext) -> TokenGrant | None:
        """The caller's entry in the current table; None when access control is off.

        UnauthenticatedError when the token is unknown now: the interceptor let
        the call in, and a reload removed the token since (a long-lived call).
        """
        if not self.enabled:
            return None
        grant = self._table.lookup(bearer_token(_authorization(context)))
        if grant is None:
            raise UnauthenticatedError(
                "missing or invalid auth token: send metadata 'authorization: Bearer <token>' "
                "(the broker's tokens may have been reloaded since the call began)")
        return grant

    def require(self, context: grpc.ServicerContext, stream: str, right: Right,
                action: str = "") -> None:
        """Return when the caller has ``right`` on ``stream``, else PermissionDeniedError.

        A name that no stream can have is INVALID_ARGUMENT first, so that a
        denial never echoes arbitrary bytes back. ``action`` says what the
        right was needed for, when the RPC alone would not tell.
        """
        if not self.enabled:
            return
        grant = self.grant_of(context)
        assert grant is not None
        try:
            validate_stream_name(stream)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        if not grant.allows(stream, right):
            raise PermissionDeniedError(stream, right.value, grant.name, action)

    def require_internal_or(self, context: grpc.ServicerContext, stream: str, right: Right,
                            action: str = "") -> None:
        """``require``, except that the cluster's own token passes too (a member's call).

        Only for the RPCs members make to each other on their own behalf
        (a move's MoveIn steps); every other call decides with ``require``,
        where the cluster token has no right.
        """
        grant = self.grant_of(context)
        if grant is not None and grant.internal:
            try:
                validate_stream_name(stream)
            except ValueError as exc:
                raise InvalidArgumentError(str(exc)) from None
            return
        self.require(context, stream, right, action)

    def require_all(self, context: grpc.ServicerContext, streams: Iterable[str], right: Right,
                    action: str = "") -> None:
        """``require`` for each stream, in name order (the first missing one is reported)."""
        if self.enabled:
            for stream in sorted(set(streams)):
                self.require(context, stream, right, action)

    def require_any(self, context: grpc.ServicerContext, right: Right, action: str) -> None:
        """The caller has ``right`` on some stream (calls that name no stream: sink ids).

        PermissionDeniedError without a stream otherwise.
        """
        grant = self.grant_of(context)
        if grant is not None and not grant.globs[right]:
            raise PermissionDeniedError("", right.value, grant.name, action)

    def reader_of(self, token: bytes | None) -> Callable[[str], bool] | None:
        """For the HTTP port (metrics, web console): which streams ``token`` may read.

        None when access control is on and the token is missing or unknown
        (the caller answers 401); everything when access control is off.
        """
        if not self.enabled:
            return lambda _name: True
        grant = self._table.lookup(token)
        if grant is None:
            return None
        return lambda name: grant.allows(name, Right.READ)

    def readable(self, context: grpc.ServicerContext) -> Callable[[str], bool]:
        """A filter of stream names the caller may read (list and pattern replies)."""
        grant = self.grant_of(context)
        if grant is None:
            return lambda _name: True
        return lambda name: grant.allows(name, Right.READ)

    # ------------------------------------------------------------ reloads

    def reload(self, why: str) -> bool:
        """Read the tokens file again and swap the table in; False (old table kept) on error."""
        if self.tokens_file is None:
            log.info("%s: no tokens_file is configured; nothing to reload", why)
            return False
        with self._reload_lock:
            self._stamp = _stamp(self.tokens_file)  # a bad file is retried once it changes
            try:
                table = TokenTable.build(self._auth_token, self.tokens_file,
                                         self._cluster_token)
            except TokensFileError as exc:
                log.error("%s: tokens file not reloaded, the previous %d token(s) stay in "
                          "force: %s", why, len(self._table), exc)
                return False
            self._table = table
        log.info("%s: tokens file %s reloaded: %d token(s): %s", why, self.tokens_file,
                 len(table), ", ".join(table.names) or "(none)")
        return True

    def request_reload(self) -> None:
        """Reload soon, on the watcher thread (safe to call from a signal handler)."""
        if self.tokens_file is None:
            log.info("SIGHUP: no tokens_file is configured; nothing to reload")
            return
        self._wake.set()

    def start(self) -> Self:
        """Start watching the tokens file (no thread without one)."""
        if self.tokens_file is not None and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="tokens-watch",
                                             daemon=True)
            self._watcher.start()
        return self

    def _watch(self) -> None:
        while not self._stop.is_set():
            signalled = self._wake.wait(POLL_INTERVAL_S)
            if self._stop.is_set():
                return
            try:
                if signalled:
                    self._wake.clear()
                    self.reload("SIGHUP")
                elif _stamp(self.tokens_file) != self._stamp:
                    self.reload("tokens file changed")
            except Exception:  # a bug must not end the watching
                log.exception("tokens file reload failed")

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
            self._watcher = None

"""Calls from one member to the others: one gRPC channel per member, requests as wire bytes.

Members ask each other two kinds of things (npstream.broker.cluster.router):
which streams they hold (``ClusterService.Owners``) and their part of a
cluster-wide answer (ListStreams, EndOffsets, StreamStats). Every such call
carries ``x-npstream-cluster-local: 1``, so the member asked answers from its
own streams and never asks further (no loops), and the *caller's* own
``authorization`` header, so the member asked applies the caller's rights
(every member must therefore know the same tokens). Calls a member makes on
its own behalf (a move's steps, the dead-letter holder check) carry the
cluster's token instead when one is configured (``member_metadata``). Requests and replies
travel as bytes: a fan-out forwards the request it received and merges the
replies, with no per-method code here.

With TLS on, members talk TLS: the peer's certificate is checked against
``peer_ca_file`` (default: the system's roots) and, when the broker asks its
own clients for certificates (``tls_client_ca_file``), it presents its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc

from npstream.broker.cluster.tuning import PEER_THREADS
from npstream.proto import metadata_keys

__all__ = ["PeerFailure", "Peers", "forwarded_metadata", "member_metadata"]

log = logging.getLogger(__name__)

T = TypeVar("T")



def forwarded_metadata(context: grpc.ServicerContext) -> tuple[tuple[str, str], ...]:
    """What a member sends with a call made on behalf of ``context``'s caller."""
    forwarded: list[tuple[str, str]] = [(metadata_keys.CLUSTER_LOCAL, "1")]
    for key, value in context.invocation_metadata() or ():
        if key == metadata_keys.AUTHORIZATION:
            forwarded.append((key, value if isinstance(value, str) else value.decode()))
    return tuple(forwarded)


def member_metadata(cluster_token: str) -> tuple[tuple[str, str], ...] | None:
    """What a member's calls on its own behalf carry: the cluster's token ([cluster]
    cluster_token, npstream.broker.auth.tokens); None when none is configured."""
    if not cluster_token:
        return None
    return ((metadata_keys.CLUSTER_LOCAL, "1"),
            (metadata_keys.AUTHORIZATION, f"Bearer {cluster_token}"))


@dataclass(frozen=True)
class PeerFailure:
    """A member's call that failed: which member, and the gRPC error (or None: no reply)."""

    member: str
    error: grpc.RpcError | None
    detail: str

    @property
    def unreachable(self) -> bool:
        """The member did not answer at all (down, or past the timeout)."""
        code = self.error.code() if self.error is not None else None
        return code in (None, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class Peers:
    """Channels to the other members (opened on first use) and parallel calls over them."""

    def __init__(self, members: Sequence[str], *, timeout_s: float, tls: bool = False,
                 root_certificates: bytes | None = None, client_cert: bytes | None = None,
                 client_key: bytes | None = None, max_message_bytes: int = 64 << 20) -> None:
        self.members = tuple(members)
        self.timeout_s = timeout_s
        self._tls = tls
        self._roots = root_certificates
        self._cert = client_cert
        self._key = client_key
        self._options = [("grpc.max_send_message_length", max_message_bytes),
                         ("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.initial_reconnect_backoff_ms", 100),
                         ("grpc.min_reconnect_backoff_ms", 100),
                         ("grpc.max_reconnect_backoff_ms", 1000)]
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=PEER_THREADS, thread_name_prefix="peer")

    @classmethod
    def from_files(cls, members: Sequence[str], *, timeout_s: float, tls: bool,
                   peer_ca_file: str, cert_file: str, key_file: str, present_cert: bool,
                   max_message_bytes: int) -> Peers:
        """Peers as the broker's config describes them (file contents read now)."""
        def read(name: str) -> bytes | None:
            return Path(name).read_bytes() if name else None

        return cls(members, timeout_s=timeout_s, tls=tls, root_certificates=read(peer_ca_file),
                   client_cert=read(cert_file) if present_cert else None,
                   client_key=read(key_file) if present_cert else None,
                   max_message_bytes=max_message_bytes)

    def _channel(self, member: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(member)
            if channel is None:
                if self._tls:
                    credentials = grpc.ssl_channel_credentials(
                        root_certificates=self._roots, private_key=self._key,
                        certificate_chain=self._cert)
                    channel = grpc.secure_channel(member, credentials, options=self._options)
                else:
                    channel = grpc.insecure_channel(member, options=self._options)
                self._channels[member] = channel
            return channel

    def call(self, member: str, method: str, request: bytes,
             metadata: Sequence[tuple[str, str]], timeout_s: float | None = None) -> bytes:
        """One unary call (``method``: "/npstream.v1.Service/Method") with wire bytes both ways."""
        send = self._channel(member).unary_unary(method, request_serializer=None,
                                                 response_deserializer=None)
        reply: bytes = send(request, timeout=timeout_s or self.timeout_s,
                            metadata=tuple(metadata))
        return reply

    def each(self, members: Sequence[str], call: Callable[[str], T],
             ) -> tuple[dict[str, T], list[PeerFailure]]:
        """``call(member)`` for every member at once: the replies, and the failures."""
        futures = {member: self._pool.submit(call, member) for member in members}
        replies: dict[str, T] = {}
        failures: list[PeerFailure] = []
        for member, future in futures.items():
            try:
                replies[member] = future.result()
            except grpc.RpcError as exc:
                failures.append(PeerFailure(member, exc, _detail(exc)))
            except Exception as exc:  # a reply that does not parse: report, never hide
                log.warning("call to cluster member %s failed: %r", member, exc)
                failures.append(PeerFailure(member, None, repr(exc)))
        return replies, failures

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()


def _detail(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code is not None else 'error'}: {details}"

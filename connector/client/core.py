"""The part of ``npstream.Client`` every other part stands on: one connection and its calls.

``Client`` is assembled from parts that each cover one area of the broker's
API (``stream_admin``, ``publisher``, ``reader``, plus the doorways to groups
and the sink in ``client``). They all send through the methods here, so auth,
retries and error mapping stay in ``npstream.client.connection`` and a part
never holds its own channel. Code that needs only "something that can call
the broker" (``npstream.client.group_rpc``) types its argument as
``ClientCore``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Self

from npstream.client.connection import Connection, StreamingCall

__all__ = ["ClientCore"]


class ClientCore:
    """The connection of a ``Client`` and its low-level calls (see ``npstream.Client``)."""

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
        local_reads: bool = True,
    ) -> None:
        self._conn = Connection(
            address,
            token,
            tls=tls,
            root_certificates=root_certificates,
            client_cert=client_cert,
            client_key=client_key,
            timeout=timeout,
            retry_deadline=retry_deadline,
        )
        self.address = self._conn.address
        self.timeout = self._conn.timeout
        # Read stored frames from the broker's files when it runs on this
        # machine (npstream.client.local_reads); switched off for good at the first
        # sign that it cannot work here.
        self._local_reads = local_reads

    # ------------------------------------------------------------ plumbing

    def call(
        self, rpc: str, request: Any, *, timeout: float | None = None, idempotent: bool = True
    ) -> Any:
        """Send a unary RPC such as ``"StreamService.Fetch"`` (auth, retries, error mapping)."""
        return self._conn.call(rpc, request, timeout=timeout, idempotent=idempotent)

    def call_serialized(
        self, rpc: str, request: bytes, response_type: Any, *,
        timeout: float | None = None, idempotent: bool = True,
    ) -> Any:
        """``call`` with a request already in protobuf wire bytes (npstream.proto.wire builds them).

        Saves copying a big bytes field into a message and out again; the
        reply is a ``response_type`` message.
        """
        return self._conn.call_serialized(rpc, request, response_type, timeout=timeout,
                                          idempotent=idempotent)

    def stream(
        self, rpc: str, request_iterator: Iterator[Any], *, timeout: float | None = None
    ) -> StreamingCall:
        """Open a bidirectional streaming RPC (``"GroupService.Subscribe"``); not retried."""
        return self._conn.stream(rpc, request_iterator, timeout=timeout)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(address={self.address!r})"

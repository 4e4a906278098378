"""The part of ``npstream.Client`` every other part stands on: one connection and its calls.

``Client`` is assembled from parts that each cover one area of the broker's
API (``stream_admin``, ``publisher``, ``reader``, plus the doorways to groups
and the sink in ``client``). They all send through the methods here, so auth,
retries and error mapping stay in ``npstream.client.connection`` and a part
never holds its own channel. Code that needs only "something that can call
the broker" (``npstream.client.group_rpc``) types its argument as
``ClientCore``.

In a cluster of brokers the calls about one stream go to the broker that
holds it (``npstream.client.routing``: redirects followed, owners
remembered); the sink's per-broker calls name their broker (``broker=``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Self

from npstream.client.connection import Connection, StreamingCall
from npstream.client.routing import Brokers, stream_of
from npstream.client.stubs import Rpc

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
        def connect(target: str | None) -> Connection:
            return Connection(target, token, tls=tls, root_certificates=root_certificates,
                              client_cert=client_cert, client_key=client_key,
                              timeout=timeout, retry_deadline=retry_deadline)

        self._conn = connect(address)
        # This broker and, in a cluster, the others: each stream's calls go to its owner.
        self._brokers = Brokers(self._conn, connect)
        self.address = self._conn.address
        self.timeout = self._conn.timeout
        # Read stored frames from the broker's files when it runs on this
        # machine (npstream.client.local_reads); switched off for good at the first
        # sign that it cannot work here.
        self._local_reads = local_reads

    # ------------------------------------------------------------ plumbing

    def call(
        self, rpc: Rpc | str, request: Any, *, timeout: float | None = None,
        idempotent: bool = True, broker: str | None = None,
    ) -> Any:
        """Send a unary RPC (auth, retries, error mapping).

        ``rpc`` names the generated stub's method, ``lambda s: s.StreamService.Fetch``
        (npstream.client.stubs); the name ``"StreamService.Fetch"`` works too.

        A call about one stream goes to the broker holding it (redirects
        followed); ``broker`` (an address) sends it to that broker as it is.
        """
        if broker is not None:
            return self._brokers.connection(broker).call(rpc, request, timeout=timeout,
                                                         idempotent=idempotent)
        stream = stream_of(request)
        if stream is None:
            return self._conn.call(rpc, request, timeout=timeout, idempotent=idempotent)
        return self._brokers.routed(stream, lambda conn: conn.call(
            rpc, request, timeout=timeout, idempotent=idempotent))

    def call_raw_reply(
        self, rpc: Rpc | str, request: Any, *, timeout: float | None = None,
        idempotent: bool = True,
    ) -> bytes:
        """``call`` (routed the same way) whose reply stays protobuf wire bytes."""
        stream = stream_of(request)
        if stream is None:
            return self._conn.call_raw_reply(rpc, request, timeout=timeout,
                                             idempotent=idempotent)
        return self._brokers.routed(stream, lambda conn: conn.call_raw_reply(
            rpc, request, timeout=timeout, idempotent=idempotent))

    def call_serialized(
        self, rpc: Rpc | str, request: bytes, response_type: Any, *,
        timeout: float | None = None, idempotent: bool = True, broker: str | None = None,
    ) -> Any:
        """``call`` with a request already in protobuf wire bytes (npstream.proto.wire builds them).

        Saves copying a big bytes field into a message and out again; the
        reply is a ``response_type`` message. Sent to ``broker`` (an
        address; None: this client's broker), never routed.
        """
        return self._brokers.connection(broker or "").call_serialized(
            rpc, request, response_type, timeout=timeout, idempotent=idempotent)

    def stream(
        self, rpc: Rpc | str, request_iterator: Iterator[Any], *, timeout: float | None = None,
        stream: str | None = None,
    ) -> StreamingCall:
        """Open a bidirectional streaming RPC (``lambda s: s.GroupService.Subscribe``); not retried.

        ``stream``: the stream the call is about; it goes to that stream's broker.
        """
        conn = self._conn if stream is None else self._brokers.connection(
            self._brokers.owner_of(stream))
        return conn.stream(rpc, request_iterator, timeout=timeout)

    def broker_of(self, stream: str) -> str:
        """The address of the broker that holds ``stream`` (or would create it).

        This client's own address without a cluster. Asks the broker once per
        stream (``ClusterService.Owners``); later answers are remembered.
        """
        return self._brokers.address_of(self._brokers.owner_of(stream))

    def brokers_of(self, streams: Iterable[str]) -> dict[str, str]:
        """``broker_of`` for many streams (one call for those not known yet)."""
        return {stream: self._brokers.address_of(owner)
                for stream, owner in self._brokers.owners_of(streams).items()}

    def forget_brokers(self, streams: Iterable[str]) -> None:
        """Forget the brokers remembered for ``streams`` (a redirect said one moved)."""
        for stream in streams:
            self._brokers.forget(stream)

    def close(self) -> None:
        self._brokers.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(address={self.address!r})"

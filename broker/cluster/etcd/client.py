"""A small typed client of etcd's v3 gRPC API: keys, transactions, leases, watches.

What a broker needs of its coordinator and no more. It speaks etcd's own
protocol through stubs generated from etcd's protos (pb/, made by
proto/generate_etcd.py): the PyPI ``etcd3`` package does not import with
current protobuf. Keys are ``str`` (UTF-8), values ``bytes``.

Endpoints are ``http://host:port`` (or ``https://``, checked against the
system's roots); calls go to one of them and move to the next when it does
not answer, so a cluster of etcd members keeps serving while one is down.
``EtcdUnavailable`` means no endpoint answered within the call's timeout.

Watches and lease keep-alives run on their own daemon threads and survive a
lost connection: a watch resumes after the last revision it delivered (when
etcd compacted that history away it tells its callback to read afresh); a
keep-alive that cannot reach etcd for longer than the lease's TTL reports
the lease lost, since etcd has revoked it by then.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc

from npstream.broker.cluster.errors import EtcdError, EtcdUnavailable
from npstream.broker.cluster.etcd.pb.etcdserverpb import rpc_pb2 as rpc
from npstream.broker.cluster.etcd.pb.etcdserverpb import rpc_pb2_grpc as rpc_grpc
from npstream.broker.cluster.etcd.pb.mvccpb import kv_pb2
from npstream.broker.cluster.tuning import ETCD_RECONNECT_DELAY_S, ETCD_TIMEOUT_S

__all__ = ["Compare", "EtcdClient", "Event", "KeyValue",
           "LeaseKeeper", "Op", "TxnResult", "Watch", "parse_endpoints", "prefix_end"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def parse_endpoints(value: str | Sequence[str]) -> tuple[str, ...]:
    """``http://host:port`` endpoints from a list or one comma-separated string.

    ValueError naming the bad entry and the accepted form.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    endpoints: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"etcd endpoint {item!r} is not a string like http://HOST:2379")
        item = item.strip()
        if not item:
            continue
        parts = urlsplit(item)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None \
                or parts.path not in ("", "/"):
            raise ValueError(f"etcd endpoint '{item}' is not http://HOST:PORT or "
                             f"https://HOST:PORT")
        endpoints.append(item.rstrip("/"))
    return tuple(endpoints)


def prefix_end(prefix: str) -> bytes:
    """The range end covering every key that starts with ``prefix`` (etcd's convention)."""
    raw = bytearray(prefix.encode())
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"  # every key


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd holds it: its value and the revisions a transaction compares."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def of(cls, kv: kv_pb2.KeyValue) -> KeyValue:
        return cls(kv.key.decode(), kv.value, kv.create_revision, kv.mod_revision,
                   kv.version, kv.lease)


class EventType(Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True)
class Event:
    """One change a watch saw: a put (``kv`` the new value) or a delete (``kv.value`` b"")."""

    type: EventType
    kv: KeyValue


_RESULTS = {"=": rpc.Compare.EQUAL, "!=": rpc.Compare.NOT_EQUAL,
            "<": rpc.Compare.LESS, ">": rpc.Compare.GREATER}


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction: a key's mod_revision, version or value against a
    constant (a missing key has mod_revision and version 0, so ``version(key, "=", 0)``
    is "does not exist")."""

    message: rpc.Compare

    @staticmethod
    def _make(key: str, op: str, **target: Any) -> Compare:
        if op not in _RESULTS:
            raise ValueError(f"compare operator {op!r} is not one of {', '.join(_RESULTS)}")
        field = next(iter(target))
        kind = {"mod_revision": rpc.Compare.MOD, "version": rpc.Compare.VERSION,
                "value": rpc.Compare.VALUE}[field]
        return Compare(rpc.Compare(key=key.encode(), result=_RESULTS[op], target=kind,
                                   **target))

    @staticmethod
    def mod_revision(key: str, op: str, revision: int) -> Compare:
        return Compare._make(key, op, mod_revision=revision)

    @staticmethod
    def version(key: str, op: str, version: int) -> Compare:
        return Compare._make(key, op, version=version)

    @staticmethod
    def value(key: str, op: str, value: bytes) -> Compare:
        return Compare._make(key, op, value=value)


@dataclass(frozen=True)
class Op:
    """One operation of a transaction's branch."""

    message: rpc.RequestOp

    @staticmethod
    def put(key: str, value: bytes, lease: int = 0) -> Op:
        return Op(rpc.RequestOp(request_put=rpc.PutRequest(key=key.encode(), value=value,
                                                           lease=lease)))

    @staticmethod
    def delete(key: str) -> Op:
        return Op(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key.encode())))

    @staticmethod
    def get(key: str) -> Op:
        return Op(rpc.RequestOp(request_range=rpc.RangeRequest(key=key.encode())))


@dataclass(frozen=True)
class TxnResult:
    """Whether the comparisons held, the store's revision after it, and what each
    ``get`` of the branch taken read (None for a missing key; puts and deletes give None)."""

    succeeded: bool
    revision: int
    gets: tuple[KeyValue | None, ...]


class EtcdClient:
    """Calls to an etcd cluster, moving to the next endpoint when one does not answer."""

    def __init__(self, endpoints: str | Sequence[str], *,
                 timeout_s: float = ETCD_TIMEOUT_S) -> None:
        self.endpoints = parse_endpoints(endpoints)
        if not self.endpoints:
            raise ValueError("no etcd endpoint given (http://HOST:2379[,...])")
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._current = 0
        self._channels: dict[str, grpc.Channel] = {}
        self._closed = False

    # ------------------------------------------------------------ plumbing

    def _channel(self, endpoint: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(endpoint)
            if channel is None:
                parts = urlsplit(endpoint)
                target = parts.netloc
                options = [("grpc.initial_reconnect_backoff_ms", 100),
                           ("grpc.min_reconnect_backoff_ms", 100),
                           ("grpc.max_reconnect_backoff_ms", 1000)]
                channel = (grpc.secure_channel(target, grpc.ssl_channel_credentials(),
                                               options=options)
                           if parts.scheme == "https"
                           else grpc.insecure_channel(target, options=options))
                self._channels[endpoint] = channel
            return channel

    def _endpoints_in_turn(self) -> Iterator[tuple[int, str]]:
        start = self._current
        for step in range(len(self.endpoints)):
            index = (start + step) % len(self.endpoints)
            yield index, self.endpoints[index]

    def _call(self, make: Callable[[grpc.Channel], T]) -> T:
        """``make(channel)`` against the current endpoint, then the next ones on no answer."""
        last: grpc.RpcError | None = None
        for index, endpoint in self._endpoints_in_turn():
            try:
                result = make(self._channel(endpoint))
            except grpc.RpcError as exc:
                if exc.code() not in _RETRIED:
                    raise EtcdError(f"etcd at {endpoint}: {exc.details()}") from None
                last = exc
                continue
            self._current = index
            return result
        detail = last.details() if last is not None else "no endpoint"
        raise EtcdUnavailable(f"no etcd endpoint of {', '.join(self.endpoints)} answered "
                              f"within {self.timeout_s:g}s: {detail}")

    def kv(self, channel: grpc.Channel) -> rpc_grpc.KVStub:
        return rpc_grpc.KVStub(channel)

    # ------------------------------------------------------------ keys

    def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Set ``key``; the store's revision after the put."""
        request = rpc.PutRequest(key=key.encode(), value=value, lease=lease)
        reply = self._call(lambda ch: self.kv(ch).Put(request, timeout=self.timeout_s))
        return int(reply.header.revision)

    def get(self, key: str) -> KeyValue | None:
        """``key``'s value and revisions, None when it does not exist."""
        items, _revision = self._range(rpc.RangeRequest(key=key.encode()))
        return items[0] if items else None

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key starting with ``prefix`` (sorted by key), and the store's revision
        they were read at (a watch from revision + 1 misses nothing after them)."""
        return self._range(rpc.RangeRequest(
            key=prefix.encode(), range_end=prefix_end(prefix),
            sort_order=rpc.RangeRequest.ASCEND, sort_target=rpc.RangeRequest.KEY))

    def _range(self, request: rpc.RangeRequest) -> tuple[list[KeyValue], int]:
        reply = self._call(lambda ch: self.kv(ch).Range(request, timeout=self.timeout_s))
        return [KeyValue.of(kv) for kv in reply.kvs], int(reply.header.revision)

    def delete(self, key: str) -> int:
        """Delete ``key``; how many keys went (0 or 1)."""
        return self._delete(rpc.DeleteRangeRequest(key=key.encode()))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with ``prefix``; how many went."""
        return self._delete(rpc.DeleteRangeRequest(key=prefix.encode(),
                                                   range_end=prefix_end(prefix)))

    def _delete(self, request: rpc.DeleteRangeRequest) -> int:
        reply = self._call(lambda ch: self.kv(ch).DeleteRange(request, timeout=self.timeout_s))
        return int(reply.deleted)

    def txn(self, compare: Sequence[Compare], success: Sequence[Op],
            failure: Sequence[Op] = ()) -> TxnResult:
        """If every comparison holds, ``success``, else ``failure``: atomically."""
        request = rpc.TxnRequest(compare=[c.message for c in compare],
                                 success=[o.message for o in success],
                                 failure=[o.message for o in failure])
        reply = self._call(lambda ch: self.kv(ch).Txn(request, timeout=self.timeout_s))
        gets: list[KeyValue | None] = []
        for response in reply.responses:
            if response.WhichOneof("response") == "response_range":
                kvs = response.response_range.kvs
                gets.append(KeyValue.of(kvs[0]) if kvs else None)
            else:
                gets.append(None)
        return TxnResult(bool(reply.succeeded), int(reply.header.revision), tuple(gets))

    # ------------------------------------------------------------ leases

    def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; its id. Keys put with it go when it ends."""
        request = rpc.LeaseGrantRequest(TTL=ttl_s)
        reply = self._call(lambda ch: rpc_grpc.LeaseStub(ch).LeaseGrant(
            request, timeout=self.timeout_s))
        if reply.error:
            raise EtcdError(f"etcd refused a lease of {ttl_s}s: {reply.error}")
        return int(reply.ID)

    def revoke(self, lease: int) -> None:
        """End ``lease`` now (its keys are deleted); a lease already gone is no error."""
        request = rpc.LeaseRevokeRequest(ID=lease)
        try:
            self._call(lambda ch: rpc_grpc.LeaseStub(ch).LeaseRevoke(
                request, timeout=self.timeout_s))
        except EtcdUnavailable:
            raise
        except EtcdError as exc:
            if "lease not found" not in str(exc):
                raise

    def time_to_live(self, lease: int) -> int:
        """Seconds ``lease`` has left; -1 when it does not exist (expired or revoked)."""
        request = rpc.LeaseTimeToLiveRequest(ID=lease)
        reply = self._call(lambda ch: rpc_grpc.LeaseStub(ch).LeaseTimeToLive(
            request, timeout=self.timeout_s))
        return int(reply.TTL)

    def keep_alive(self, lease: int, ttl_s: int, on_lost: Callable[[str], None]) -> LeaseKeeper:
        """Renew ``lease`` (of ``ttl_s``) every third of its TTL on a thread, until stopped;
        ``on_lost(why)`` once if it ends on its own (expired, revoked, etcd out of reach
        for longer than the TTL)."""
        return LeaseKeeper(self, lease, ttl_s, on_lost)

    # ------------------------------------------------------------ watches

    def watch_prefix(self, prefix: str, on_events: Callable[[list[Event] | None], None], *,
                     start_revision: int = 0) -> Watch:
        """Call ``on_events(events)`` with every change under ``prefix`` from
        ``start_revision`` (0: from now) on, in revision order, on a thread.

        ``on_events(None)`` when changes may have been missed (etcd compacted
        the history a resumed watch needed): read the prefix afresh.
        """
        return Watch(self, prefix, on_events, start_revision)

    def _stream_endpoint(self) -> str:
        return self.endpoints[self._current]

    def _failover(self) -> None:
        """A stream (watch, keep-alive) lost its endpoint: the next ones first, next time."""
        self._current = (self._current + 1) % len(self.endpoints)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()


class _Requests:
    """The request side of a bidirectional stream: what is put, until closed."""

    _END = object()

    def __init__(self) -> None:
        self._queue: queue.Queue[object] = queue.Queue()

    def put(self, request: object) -> None:
        self._queue.put(request)

    def close(self) -> None:
        self._queue.put(self._END)

    def __iter__(self) -> Iterator[Any]:
        while (item := self._queue.get()) is not self._END:
            yield item


class LeaseKeeper:
    """A thread renewing one lease over etcd's LeaseKeepAlive stream."""

    def __init__(self, client: EtcdClient, lease: int, ttl_s: int,
                 on_lost: Callable[[str], None]) -> None:
        self.lease = lease
        self.ttl_s = ttl_s
        self._client = client
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._requests: _Requests | None = None
        self.last_renewed = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"etcd-lease-{lease:x}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval = max(self.ttl_s / 3, 0.2)
        while not self._stop.is_set():
            requests = _Requests()
            self._requests = requests
            endpoint = self._client._stream_endpoint()
            try:
                stub = rpc_grpc.LeaseStub(self._client._channel(endpoint))
                replies = stub.LeaseKeepAlive(iter(requests))
                while not self._stop.is_set():
                    requests.put(rpc.LeaseKeepAliveRequest(ID=self.lease))
                    reply = next(replies)
                    if reply.TTL <= 0:
                        self._lost(f"etcd says lease {self.lease:x} is gone (expired or "
                                   f"revoked)")
                        return
                    self.last_renewed = time.monotonic()
                    self._stop.wait(interval)
            except (grpc.RpcError, StopIteration) as exc:
                if self._stop.is_set():
                    return
                detail = exc.details() if isinstance(exc, grpc.RpcError) else "stream ended"
                log.warning("renewing etcd lease %x through %s failed: %s", self.lease,
                            endpoint, detail)
                self._client._failover()
            finally:
                requests.close()
            if time.monotonic() - self.last_renewed > self.ttl_s:
                self._lost(f"etcd was out of reach for more than the lease's {self.ttl_s}s")
                return
            self._stop.wait(ETCD_RECONNECT_DELAY_S)

    def _lost(self, why: str) -> None:
        if not self._stop.is_set():
            self._on_lost(why)

    def stop(self) -> None:
        """Stop renewing (the lease itself stays until revoked or expired)."""
        self._stop.set()
        if self._requests is not None:
            self._requests.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)


class Watch:
    """A thread delivering the changes under one prefix (EtcdClient.watch_prefix)."""

    def __init__(self, client: EtcdClient, prefix: str,
                 on_events: Callable[[list[Event] | None], None], start_revision: int) -> None:
        self.prefix = prefix
        self._client = client
        self._on_events = on_events
        self._next_revision = start_revision
        self._stop = threading.Event()
        self._call: grpc.Future | None = None
        self._requests: _Requests | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"etcd-watch-{prefix}",
                                        daemon=True)
        self._thread.start()
        self._started.wait(timeout=client.timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            requests = _Requests()
            self._requests = requests
            endpoint = self._client._stream_endpoint()
            try:
                stub = rpc_grpc.WatchStub(self._client._channel(endpoint))
                call = stub.Watch(iter(requests))
                self._call = call
                requests.put(rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
                    key=self.prefix.encode(), range_end=prefix_end(self.prefix),
                    start_revision=self._next_revision)))
                for reply in call:
                    if self._handle(reply):
                        break
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return
                log.warning("etcd watch on %s through %s failed: %s; watching again",
                            self.prefix, endpoint, exc.details())
                self._client._failover()
            finally:
                requests.close()
            self._started.set()
            self._stop.wait(ETCD_RECONNECT_DELAY_S)

    def _handle(self, reply: rpc.WatchResponse) -> bool:
        """Deliver one reply; True when the watch must be opened again."""
        if reply.created:
            if self._next_revision == 0:  # from now: resume after what it started at
                self._next_revision = reply.header.revision + 1
            self._started.set()
        if reply.compact_revision:
            log.warning("etcd compacted the history of %s past revision %d: reading afresh",
                        self.prefix, self._next_revision)
            self._next_revision = 0
            self._on_events(None)
            return True
        if reply.canceled:
            log.warning("etcd cancelled the watch on %s: %s", self.prefix, reply.cancel_reason)
            return True
        if reply.events:
            events = [Event(EventType.PUT if e.type == kv_pb2.Event.PUT else EventType.DELETE,
                            KeyValue.of(e.kv)) for e in reply.events]
            self._next_revision = reply.events[-1].kv.mod_revision + 1
            self._on_events(events)
        return False

    def cancel(self) -> None:
        self._stop.set()
        if self._requests is not None:
            self._requests.close()
        if self._call is not None:
            self._call.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

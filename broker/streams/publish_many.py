"""PublishMany: many streams' publishes in one request, one result per entry.

Why: a stream per chat or sensor is created by its first publish, thousands a
second from one client. One request per new stream spent most of the
broker's time in gRPC's own per-message Python (request iterator, response
send, thread wake-ups; docs/scaling.md has the figures); Kafka's
ProduceRequest answers the same problem by carrying many topic-partitions'
data. Here one request carries up to MAX_PUBLISH_MANY_ENTRIES entries.

Each entry is exactly a PublishRequest and goes through the same path as a
PublishStream request (the servicer's ``write`` callable: name check, write
right, auto-create, the nursery for a new stream's lone first message, the
log's append), so nothing about storage is decided here. All entries are
written first, in order, and only then waited for: their fsyncs are shared,
and the nursery writer commits the new streams of the whole request in one
transaction (or a few), durable before the reply leaves.

An entry that fails (bad name, no write right, too large, another member's
stream) gets the status a Publish of it alone would have ended with,
including the trailing metadata (reason, NOT_OWNER's owner) as a map: the
other entries are unaffected. In a cluster each entry is routed as the
interceptor routes a Publish (holders of unknown names asked once for the
whole request) and counted as a call on its stream while it is written, so
a stream move waits for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Protocol

import grpc
from google.protobuf.message import DecodeError

from npstream.broker.errors import BrokerError, InvalidArgumentError
from npstream.broker.rpc.status import error_status
from npstream.proto import pb
from npstream.proto.defaults import MAX_PUBLISH_MANY_BYTES, MAX_PUBLISH_MANY_ENTRIES
from npstream.proto.names import validate_stream_name

__all__ = ["METHOD", "Routing", "parse_publish_many", "serve_publish_many"]

METHOD = "PublishMany"

# What writing one entry gives back: the reply, to be called once every entry is written
# (it waits for the entry's fsync or nursery commit), or the entry's error.
Reply = Callable[[], pb.PublishResponse]


class Routing(Protocol):
    """What PublishMany asks of the cluster (npstream.broker.cluster.router.Cluster is one).

    A protocol, so that the streams package imports nothing of cluster/.
    """

    def route_many(self, streams: Iterable[str],
                   context: grpc.ServicerContext) -> dict[str, BrokerError]:
        """The error of each of ``streams`` not served here."""
        ...

    def serving(self, stream: str) -> AbstractContextManager[None]:
        """Around the write of one routed entry: counted as a call on ``stream``."""
        ...


def parse_publish_many(raw: bytes) -> pb.PublishManyRequest:
    """The request, within its bounds (proto: PublishManyRequest); InvalidArgumentError if not."""
    if len(raw) > MAX_PUBLISH_MANY_BYTES:
        raise InvalidArgumentError(
            f"PublishMany request of {len(raw)} bytes is over MAX_PUBLISH_MANY_BYTES="
            f"{MAX_PUBLISH_MANY_BYTES}: split its entries over several requests")
    try:
        request = pb.PublishManyRequest.FromString(raw)
    except DecodeError as exc:
        raise InvalidArgumentError(f"malformed PublishManyRequest: {exc}") from None
    if len(request.entries) > MAX_PUBLISH_MANY_ENTRIES:
        raise InvalidArgumentError(
            f"PublishMany request of {len(request.entries)} entries is over "
            f"MAX_PUBLISH_MANY_ENTRIES={MAX_PUBLISH_MANY_ENTRIES}: split them over several "
            "requests")
    return request


def _valid(name: str) -> bool:
    """Whether ``name`` may be routed (an invalid one is refused by ``write``, not asked about)."""
    try:
        validate_stream_name(name)
    except ValueError:
        return False
    return True


def _failed(exc: BaseException, entry: pb.PublishRequest) -> pb.PublishManyResult:
    code, details, trailing = error_status(exc, METHOD, entry)
    return pb.PublishManyResult(error=pb.EntryError(
        code=code.value[0], message=details, metadata=dict(trailing)))


def serve_publish_many(raw: bytes, context: grpc.ServicerContext,
                       write: Callable[[pb.PublishRequest], Reply],
                       cluster: Routing) -> pb.PublishManyResponse:
    """Write every entry of the request ``raw``, then wait for each: one result per entry.

    ``write`` stores one entry as a PublishStream request is stored and returns
    its reply (StreamServicer._write_request).
    """
    entries = parse_publish_many(raw).entries
    misrouted = cluster.route_many(
        (e.stream for e in entries if _valid(e.stream)), context)
    pending: list[Reply | BaseException] = []
    for entry in entries:
        try:
            error = misrouted.get(entry.stream)
            if error is not None:
                raise error
            with cluster.serving(entry.stream):
                pending.append(write(entry))
        except Exception as exc:
            pending.append(exc)
    response = pb.PublishManyResponse()
    for entry, outcome in zip(entries, pending, strict=True):
        if isinstance(outcome, BaseException):
            response.results.append(_failed(outcome, entry))
            continue
        try:
            response.results.add(published=outcome())
        except Exception as exc:
            response.results.append(_failed(exc, entry))
    return response

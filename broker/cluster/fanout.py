"""Cluster-wide answers: ListStreams, EndOffsets and StreamStats over every member.

The member a client called answers for the whole cluster, so that
``Client("any-member:7070").list_streams()`` and Spark's ``streamPattern``
see every stream, whichever member holds it, and Spark's one EndOffsets call
per trigger stays one call for the client. The member answers its own part
(the servicer, unchanged) and asks each other member for its part with
``x-npstream-cluster-local`` and the caller's token (peers.py), then merges:

* ListStreams: every member returns its first ``page_size`` names after the
  page token (a token is only the last name, so any member can continue a
  listing); the merged page is the first ``page_size`` of their union, and
  there is a next page when the union had more or some member did.
* EndOffsets and StreamStats: the pattern goes to every member; each named
  stream goes to its owner (router.py finds it), so a name no member holds
  is NOT_FOUND as on one broker.

A member that does not answer makes the whole call fail (MEMBER_UNAVAILABLE
naming it): a list that silently lacks a member's streams would make a Spark
query with a pattern drop them from its offsets. An error a member answers
with (a denied right, a missing stream) is passed on as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from npstream.broker.cluster.errors import PeerError
from npstream.broker.cluster.peers import PeerFailure, forwarded_metadata
from npstream.broker.cluster.router import Cluster
from npstream.broker.errors import MemberUnavailableError, StreamNotFoundError
from npstream.broker.streams.names import next_page_token
from npstream.proto import pb
from npstream.proto.defaults import DEFAULT_LIST_PAGE_SIZE, MAX_LIST_PAGE_SIZE

__all__ = ["FANOUT_METHODS", "PeerError", "fan_out"]

M = TypeVar("M", bound=Message)

_PREFIX = "/npstream.v1.StreamService/"


def _raise_failures(failures: list[PeerFailure], need: str) -> None:
    """MEMBER_UNAVAILABLE for members that did not answer; else the first member's error."""
    silent = [f for f in failures if f.unreachable]
    if silent:
        raise MemberUnavailableError(", ".join(f.member for f in silent), need,
                                     "; ".join(f"{f.member}: {f.detail}" for f in silent))
    if failures:
        raise PeerError(failures[0])


class _Parts:
    """This member's part of an answer and the other members' parts."""

    def __init__(self, cluster: Cluster, method: str, context: grpc.ServicerContext) -> None:
        self.cluster = cluster
        self.method = method
        self.context = context
        self.metadata = forwarded_metadata(context)

    def ask(self, requests: dict[str, Message], reply_type: type[M], need: str) -> list[M]:
        """Each member's reply to its request, all at once; failures raised (see module doc)."""
        def call(member: str) -> M:
            raw = self.cluster.peers.call(member, self.method,
                                          requests[member].SerializeToString(), self.metadata)
            return reply_type.FromString(raw)

        replies, failures = self.cluster.peers.each(list(requests), call)
        _raise_failures(failures, need)
        return [replies[member] for member in requests]


def _list_streams(parts: _Parts, request: pb.ListStreamsRequest,
                  local: Callable[[pb.ListStreamsRequest], pb.ListStreamsResponse],
                  ) -> pb.ListStreamsResponse:
    size = min(request.page_size or DEFAULT_LIST_PAGE_SIZE, MAX_LIST_PAGE_SIZE)
    if request.page_size < 0:  # the servicer's own refusal, with its message
        return local(request)
    own = local(request)
    others = parts.ask({m: request for m in parts.cluster.others}, pb.ListStreamsResponse,
                       "the list of streams would be incomplete")
    merged: dict[str, pb.StreamInfo] = {}
    for reply in (own, *others):
        for info in reply.streams:
            merged.setdefault(info.name, info)
    names = sorted(merged)
    page = names[:size]
    more = len(names) > size or any(reply.next_page_token for reply in (own, *others))
    token = next_page_token(page[-1]) if more and page else ""
    return pb.ListStreamsResponse(streams=[merged[name] for name in page], next_page_token=token)


def _by_owner(parts: _Parts, names: Sequence[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Named streams split into this member's and each other member's (their owners)."""
    cluster, context = parts.cluster, parts.context
    mine: list[str] = []
    theirs: dict[str, list[str]] = {}
    for name in dict.fromkeys(names):
        if not cluster.may_see(context, name):
            mine.append(name)  # the servicer refuses it (PERMISSION_DENIED)
            continue
        owner, exists = cluster.owner(name, context)
        if not exists and owner == cluster.identity:
            mine.append(name)  # NOT_FOUND from the servicer, as on one broker
        elif not exists:
            raise StreamNotFoundError(name)
        elif owner == cluster.identity:
            mine.append(name)
        else:
            theirs.setdefault(owner, []).append(name)
    return mine, theirs


def _named_and_pattern(parts: _Parts, request: Any, local: Callable[[Any], Any],
                       rows: Callable[[Any], Sequence[tuple[str, Any]]],
                       need: str) -> tuple[Any, list[tuple[str, Any]]]:
    """EndOffsets / StreamStats: (this member's reply, every row by name, deduplicated)."""
    mine, theirs = _by_owner(parts, list(request.streams))
    own_request = type(request)()
    own_request.CopyFrom(request)
    del own_request.streams[:]
    own_request.streams.extend(mine)
    requests: dict[str, Message] = {}
    for member in parts.cluster.others:
        if not theirs.get(member) and not request.pattern:
            continue
        peer_request = type(request)()
        peer_request.CopyFrom(own_request)
        del peer_request.streams[:]
        peer_request.streams.extend(theirs.get(member, []))
        requests[member] = peer_request
    own = local(own_request)
    others = parts.ask(requests, type(own), need)
    merged: dict[str, Any] = {}
    for reply in (own, *others):
        for name, row in rows(reply):
            merged.setdefault(name, row)
    named = [name for name in dict.fromkeys(request.streams) if name in merged]
    rest = sorted(name for name in merged if name not in set(named))
    return own, [(name, merged[name]) for name in (*named, *rest)]


def _end_offsets(parts: _Parts, request: pb.EndOffsetsRequest,
                 local: Callable[[pb.EndOffsetsRequest], pb.EndOffsetsResponse],
                 ) -> pb.EndOffsetsResponse:
    _own, rows = _named_and_pattern(parts, request, local,
                                    lambda reply: [(s.stream, s) for s in reply.streams],
                                    "the end offsets would be incomplete")
    return pb.EndOffsetsResponse(streams=[row for _name, row in rows])


def _stream_stats(parts: _Parts, request: pb.StreamStatsRequest,
                  local: Callable[[pb.StreamStatsRequest], pb.StreamStatsResponse],
                  ) -> pb.StreamStatsResponse:
    own, rows = _named_and_pattern(parts, request, local,
                                   lambda reply: [(s.stream.name, s) for s in reply.streams],
                                   "the stream statistics would be incomplete")
    reply = pb.StreamStatsResponse(broker_time_ms=own.broker_time_ms,
                                   broker_start_ms=own.broker_start_ms)
    reply.streams.extend(row for _name, row in sorted(rows))
    return reply


_MERGES: dict[str, tuple[type[Message], Callable[..., Message]]] = {
    _PREFIX + "ListStreams": (pb.ListStreamsRequest, _list_streams),
    _PREFIX + "EndOffsets": (pb.EndOffsetsRequest, _end_offsets),
    _PREFIX + "StreamStats": (pb.StreamStatsRequest, _stream_stats),
}
FANOUT_METHODS = frozenset(_MERGES)


def fan_out(cluster: Cluster, method: str, request: Message, context: grpc.ServicerContext,
            local: Callable[[Message], Message]) -> Message:
    """The cluster-wide reply to ``request`` (a parsed request of one of FANOUT_METHODS)."""
    _request_type, merge = _MERGES[method]
    return merge(_Parts(cluster, method, context), request, local)


def request_type(method: str) -> type[Message]:
    return _MERGES[method][0]

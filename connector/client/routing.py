"""Which broker to send a call to: the one the client was given, or the stream's owner.

A cluster of brokers (docs/broker.md "A cluster of brokers") keeps each
stream on one member, and any member answers for any stream: a call about a
stream another member holds fails with NOT_OWNER naming that member (the
``x-npstream-owner`` trailing metadata, ``npstream.errors.NotOwner``).
``Brokers`` follows such redirects and remembers each stream's owner, so
``Client("any-member:7070")`` reaches every stream and, after the first call,
sends each stream's calls straight to its owner:

* unary per-stream calls (their request names the stream: ``stream_of``)
  go to the remembered owner, else to the client's own broker, and follow
  up to ``MAX_REDIRECTS`` redirects (more means the members disagree on who holds the stream);
* calls that cannot simply be resent elsewhere (a PublishStream fed by an
  iterator, a subscription, a ReadRange, a sink task's stages) ask
  ``ClusterService.Owners`` first (``owner_of``; one call per stream for the
  life of the client, none once the owner is known);
* an owner that does not answer is forgotten, so the next call asks again
  (a member that is down makes its streams unavailable until it is back).

Without a cluster every answer is "the broker you asked" and nothing
changes: a redirect never comes, and ``Owners`` (one call per client; an
older broker without it counts as a cluster of one) says so. Other brokers
get their own ``Connection`` with the same token, TLS and retry settings.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import grpc

from npstream.client.connection import Connection
from npstream.errors import BrokerUnavailable, NotOwner, NpstreamError
from npstream.proto import pb
from npstream.proto.routing import STREAM_FIELDS

__all__ = ["MAX_REDIRECTS", "Brokers", "stream_of"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Redirects one call follows: one is the rule (the member asked names the
# owner); a second covers an owner that moved meanwhile. More is a loop.
MAX_REDIRECTS = 3
# Owners remembered at most (least recently used forgotten first).
OWNER_CACHE_MAX = 100_000

# A plain dict: looked up on every call, where a read-only mapping's get costs 4x.
_STREAM_FIELDS: dict[type[Any], str] = dict(STREAM_FIELDS)


def stream_of(request: Any) -> str | None:
    """The stream a call's request names (None for a request about no single stream).

    Which request field names the stream is declared once, in npstream.proto
    (``(names_stream)``, npstream.proto.routing): the same calls the broker
    routes.
    """
    field = _STREAM_FIELDS.get(type(request))
    if field is None:
        return None
    name = getattr(request, field)
    return name if isinstance(name, str) and name else None


class Brokers:
    """The client's own connection, connections to other members, and each stream's owner.

    An owner is kept as an address; "" is the client's own broker.
    """

    def __init__(self, home: Connection, make: Callable[[str], Connection]) -> None:
        self.home = home
        self._make = make
        self._others: dict[str, Connection] = {}
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._home_names = {home.address}  # what other members call the client's broker
        self._single = False  # Owners said: no cluster (or the broker predates it)
        self._lock = threading.Lock()

    # ------------------------------------------------------------ connections

    def connection(self, address: str) -> Connection:
        """The connection to ``address`` ("" or the client's own broker: the home one)."""
        if not address or address in self._home_names:
            return self.home
        with self._lock:
            conn = self._others.get(address)
            if conn is None:
                conn = self._others[address] = self._make(address)
                log.debug("client of %s connects to cluster member %s as well",
                          self.home.address, address)
            return conn

    def address_of(self, owner: str) -> str:
        """The address a caller names a broker by: the client's own for "" (its broker)."""
        return self.home.address if not owner or owner in self._home_names else owner

    def close(self) -> None:
        with self._lock:
            others, self._others = list(self._others.values()), {}
        for conn in others:
            conn.close()
        self.home.close()

    # ------------------------------------------------------------ owners

    def remembered(self, stream: str) -> str | None:
        with self._lock:
            owner = self._owners.get(stream)
            if owner is not None:
                self._owners.move_to_end(stream)
            return owner

    def learn(self, stream: str, owner: str) -> None:
        """Remember ``owner`` (an address, "" for home) as the broker holding ``stream``."""
        owner = "" if owner in self._home_names else owner
        with self._lock:
            self._owners[stream] = owner
            self._owners.move_to_end(stream)
            while len(self._owners) > OWNER_CACHE_MAX:
                self._owners.popitem(last=False)

    def forget(self, stream: str) -> None:
        with self._lock:
            self._owners.pop(stream, None)

    def owner_of(self, stream: str) -> str:
        """The address of ``stream``'s broker ("" = home), asking ``Owners`` when unknown."""
        return self.owners_of([stream])[stream]

    def owners_of(self, streams: Iterable[str]) -> dict[str, str]:
        """``owner_of`` for many streams, with one ``Owners`` call for the unknown ones."""
        result: dict[str, str] = {}
        unknown: list[str] = []
        for stream in dict.fromkeys(streams):
            owner = "" if self._single else self.remembered(stream)
            if owner is None:
                unknown.append(stream)
            else:
                result[stream] = owner
        if unknown:
            try:
                reply: pb.OwnersResponse = self.home.call(
                    lambda s: s.ClusterService.Owners, pb.OwnersRequest(streams=unknown))
            except NpstreamError as exc:
                if exc.code != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                reply = pb.OwnersResponse(owners=[pb.StreamOwner(stream=s) for s in unknown])
            if reply.self:
                self._home_names.add(reply.self)
            if not reply.members:
                self._single = True  # a broker of its own: never ask again
            for entry in reply.owners:
                self.learn(entry.stream, entry.owner)
                result[entry.stream] = "" if entry.owner in self._home_names else entry.owner
            for stream in unknown:
                result.setdefault(stream, "")
        return result

    # ------------------------------------------------------------ routed calls

    def routed(self, stream: str, send: Callable[[Connection], T]) -> T:
        """``send`` to the stream's broker, following redirects (see the module doc)."""
        owner = self.remembered(stream) or ""
        for hop in range(MAX_REDIRECTS + 1):
            try:
                return send(self.connection(owner))
            except NotOwner as redirect:
                if not redirect.owner or hop == MAX_REDIRECTS:
                    redirect.add_note(f"followed {hop} redirect(s) for stream '{stream}'; the "
                                      "cluster's members may list different members")
                    raise
                log.debug("stream '%s' is on %s (redirected by %s)", stream, redirect.owner,
                          self.connection(owner).address)
                owner = "" if redirect.owner in self._home_names else redirect.owner
                self.learn(stream, owner)
            except BrokerUnavailable:
                if owner:
                    self.forget(stream)  # the next call asks the client's broker again
                raise
        raise AssertionError("unreachable")  # pragma: no cover

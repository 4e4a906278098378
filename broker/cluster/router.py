"""Which member owns a stream, and the redirect when it is not this one.

A stream lives on exactly one member, recorded in etcd when it is created
(stream_records.py). This member knows its own streams (its registry); for
any other name it reads the name's etcd record, which names the holder by
member id (the members, membership.py, give its address), and remembers a
holder for ``HOLDER_TTL_S``. A name without a record belongs to the live
member rendezvous hashing places it on (placement.py). So:

* a stream this member holds is served here, whatever placement says (a
  stream created before members were added stays where it is);
* a stream another member holds, or a new name placed on another member, is
  answered with NOT_OWNER naming that member (the SDK follows it);
* a new name placed here is served here (created, or NOT_FOUND as usual).

When the record names a member that is not registered now (down), or etcd
does not answer, the call fails with MEMBER_UNAVAILABLE instead of creating
a second stream of that name (a name has exactly one owner). A holder
remembered can go stale (the stream moved): the redirect then lands on a
member that does not hold it, which looks again and redirects on; the TTL
bounds how long a stale entry lives.

A stream being moved (move.py, move_state.py) is special: while it is
copied its holder refuses its calls with STREAM_MOVING (clients send them
again), and once the target holds it the old holder redirects to the target
and stops reporting it as its own, before it deletes its copy.

The caller's rights matter: a stream the caller has no right on is never
routed (served here, where the servicer refuses it with PERMISSION_DENIED),
so a redirect does not tell who holds a stream the caller may not see.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import TypeVar

import grpc

from npstream.broker.auth.access import AccessControl, Right
from npstream.broker.cluster.errors import EtcdError
from npstream.broker.cluster.membership import Membership
from npstream.broker.cluster.move_state import MoveBook
from npstream.broker.cluster.peers import Peers, forwarded_metadata, member_metadata
from npstream.broker.cluster.placement import rendezvous_owner
from npstream.broker.cluster.stream_records import StreamRecords
from npstream.broker.cluster.tuning import HOLDER_CACHE_MAX, HOLDER_TTL_S
from npstream.broker.errors import (
    BrokerError,
    DeadLetterElsewhereError,
    MemberUnavailableError,
    NotOwnerError,
)
from npstream.proto import metadata_keys, pb

__all__ = ["OWNERS_METHOD", "Cluster", "is_member_call"]

OWNERS_METHOD = "/npstream.v1.ClusterService/Owners"

T = TypeVar("T")



def is_member_call(context: grpc.ServicerContext) -> bool:
    """Whether another member made this call: answer from this member's own streams only."""
    return any(key == metadata_keys.CLUSTER_LOCAL
               for key, _value in context.invocation_metadata() or ())


class Cluster:
    """This member's view of the cluster: identity, members, placement, routing.

    A broker without members gets a disabled one: every name is its own.
    """

    def __init__(self, identity: str, holds: Callable[[str], bool], access: AccessControl,
                 peers: Peers | None, cluster_token: str = "", *, enabled: bool = False,
                 ) -> None:
        """``cluster_token``: what this member's own calls carry with auth on (peers.py).
        ``enabled``: a member of a cluster in etcd, whose view ``attach`` gives once it
        registered (the identity is known once the port is bound)."""
        self.identity = identity
        self._own_metadata = member_metadata(cluster_token) if access.enabled else None
        self.enabled = enabled
        self.membership: Membership | None = None
        self.records: StreamRecords | None = None
        self._holds = holds
        self._access = access
        self._peers = peers
        self._holders: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()
        # This member's stream moves (cluster/service.py sets it; None: no moves).
        self.moves: MoveBook | None = None

    @classmethod
    def single(cls, holds: Callable[[str], bool] = lambda _name: True,
               access: AccessControl | None = None) -> Cluster:
        """The cluster of one: no routing at all."""
        return cls("", holds, access or AccessControl(), None)

    def attach(self, identity: str, membership: Membership, records: StreamRecords) -> None:
        """This member registered in etcd: its address, the members, the stream records."""
        self.identity = identity
        self.membership = membership
        self.records = records

    @property
    def members(self) -> tuple[str, ...]:
        """Every member's address, up or down, as etcd knows them (this one included):
        the members a cluster-wide answer asks."""
        return self.membership.known_addresses() if self.membership is not None else ()

    @property
    def live_members(self) -> tuple[str, ...]:
        """The members registered under a lease now: those a new stream may go to."""
        return self.membership.addresses() if self.membership is not None else ()

    @property
    def others(self) -> tuple[str, ...]:
        return tuple(m for m in self.members if m != self.identity)

    @property
    def peers(self) -> Peers:
        assert self._peers is not None, "a cluster of one has no peers"
        return self._peers

    def placement(self, stream: str) -> str:
        """The member a new stream of this name is created on."""
        live = self.live_members
        return rendezvous_owner(stream, live) if self.enabled and live else self.identity

    # ------------------------------------------------------------ rights

    def may_see(self, context: grpc.ServicerContext, stream: str) -> bool:
        """Whether the caller has any right on ``stream`` (else it is never routed)."""
        if not self._access.enabled:
            return True
        grant = self._access.grant_of(context)
        return grant is None or grant.internal or any(
            grant.allows(stream, right) for right in Right)

    # ------------------------------------------------------------ owners

    def holds(self, stream: str) -> bool:
        """Whether this member holds ``stream`` as its owner (not one it is handing over)."""
        if not self._holds(stream):
            return False
        record = self.moves.active(stream) if self.moves is not None else None
        return record is None or record.state != "removing"

    def route(self, stream: str, context: grpc.ServicerContext, *,
              paused_ok: bool = False, found: Mapping[str, str] | None = None) -> None:
        """Return when this member serves ``stream``; NotOwnerError (a redirect) otherwise.

        StreamMovingError while the stream is paused for a move, unless
        ``paused_ok`` (MoveStream itself, which finishes that move). ``found``:
        the other members were asked already (``route_many``), these are the holders.
        """
        if not self.enabled or not self.may_see(context, stream):
            return
        record = self.moves.active(stream) if self.moves is not None else None
        if record is not None:
            if record.state == "removing":
                raise NotOwnerError(stream, record.target, True)
            if not paused_ok:
                self.moves.check(stream)  # type: ignore[union-attr]
        if self._holds(stream):
            return
        owner, exists = self.owner(stream, context, found)
        if owner != self.identity:
            raise NotOwnerError(stream, owner, exists)

    def route_many(self, streams: Iterable[str],
                   context: grpc.ServicerContext) -> dict[str, BrokerError]:
        """``route`` for each of ``streams`` (a PublishMany's valid names): the error of each
        stream not served here (NotOwnerError, StreamMovingError, MemberUnavailableError).

        The names no member is known to hold (new streams, mostly) are looked up
        with one Owners call per member for all of them, not one per name. A call
        another member made is never routed (interceptor.py).
        """
        if not self.enabled or is_member_call(context):
            return {}
        names = list(dict.fromkeys(streams))
        unknown = [name for name in names if self.may_see(context, name)
                   and not self._holds(name) and self._cached(name) is None]
        errors: dict[str, BrokerError] = {}
        found: dict[str, str] = {}
        try:
            found = self.find_holders(unknown, context)
        except MemberUnavailableError as exc:
            errors = dict.fromkeys(unknown, exc)
        asked = set(unknown)
        for name in names:
            if name in errors:
                continue
            try:
                self.route(name, context, found=found if name in asked else None)
            except BrokerError as exc:
                errors[name] = exc
        return errors

    @contextmanager
    def serving(self, stream: str) -> Iterator[None]:
        """Around the write of one routed entry: counted as a call on ``stream`` (what the
        interceptor does for a whole per-stream call), StreamMovingError while paused."""
        if self.moves is None:
            yield
            return
        with self.moves.calling(stream):
            yield

    def owned(self, context: grpc.ServicerContext,
              target_of: Callable[[str], T]) -> Callable[[str], T]:
        """``target_of`` that first routes its stream (the sink's Stage targets)."""
        if not self.enabled:
            return target_of

        def routed(stream: str) -> T:
            self.route(stream, context)
            return target_of(stream)

        return routed

    def owner(self, stream: str, context: grpc.ServicerContext,
              found: Mapping[str, str] | None = None) -> tuple[str, bool]:
        """(member, exists): the holder of ``stream``, else its placement (exists False).

        MemberUnavailableError when no answering member holds it and some
        member did not answer. ``found``: the members' answer, when asked already.
        """
        if self.holds(stream):
            return self.identity, True
        cached = self._cached(stream)
        if cached is not None:
            return cached, True
        if found is None:
            found = self.find_holders([stream], context)
        if stream in found:
            return found[stream], True
        return self.placement(stream), False

    def find_holders(self, streams: Iterable[str],
                     context: grpc.ServicerContext) -> dict[str, str]:
        """{stream: member} for the streams another member holds (their etcd records).

        MemberUnavailableError when etcd does not answer or a record names a
        member that is not registered now.
        """
        return self._find_holders(streams, forwarded_metadata(context))

    def _find_holders(self, streams: Iterable[str], metadata: Sequence[tuple[str, str]],
                      refusals_ok: bool = False) -> dict[str, str]:
        """``find_holders``: each stream's leader as its etcd record names it, by address.

        MemberUnavailableError when etcd does not answer, or a record names a
        member etcd does not list now (down, or cut off from etcd): nobody
        else may serve or create that stream.
        """
        del metadata, refusals_ok  # the records answer, not the members
        wanted = list(dict.fromkeys(streams))
        if not wanted or self.records is None or self.membership is None:
            return {}
        try:
            records = {name: self.records.lookup(name) for name in wanted}
        except EtcdError as exc:
            raise MemberUnavailableError(
                "etcd", f"it is unknown who holds stream(s) {', '.join(wanted)}",
                str(exc)) from None
        own = self.membership.record.id
        found: dict[str, str] = {}
        absent: dict[str, list[str]] = {}
        for name, record in records.items():
            if record is None or record.leader == own:
                continue
            address = self.membership.address_of(record.leader)
            if address is None:
                absent.setdefault(record.leader, []).append(name)
            else:
                found[name] = address
        if absent:
            raise MemberUnavailableError(
                ", ".join(absent),
                f"stream(s) {', '.join(n for names in absent.values() for n in names)} "
                "held there cannot be served", "not registered in etcd now (down, or cut "
                "off from etcd)")
        for stream, member in found.items():
            self._remember(stream, member)
        return found

    def _cached(self, stream: str) -> str | None:
        with self._lock:
            entry = self._holders.get(stream)
            if entry is None:
                return None
            member, expires = entry
            if expires < time.monotonic():
                del self._holders[stream]
                return None
            self._holders.move_to_end(stream)
            return member

    def _remember(self, stream: str, member: str) -> None:
        with self._lock:
            self._holders[stream] = (member, time.monotonic() + HOLDER_TTL_S)
            self._holders.move_to_end(stream)
            while len(self._holders) > HOLDER_CACHE_MAX:
                self._holders.popitem(last=False)

    # ------------------------------------------------------------ ClusterService.Owners

    def owners_reply(self, request: pb.OwnersRequest,
                     context: grpc.ServicerContext) -> pb.OwnersResponse:
        """Owners: from another member, only the named streams held here; else each one's owner."""
        reply = pb.OwnersResponse(self=self.identity, members=self.members)
        names = list(request.streams)
        if is_member_call(context):
            reply.owners.extend(pb.StreamOwner(stream=name, owner=self.identity, exists=True)
                                for name in names
                                if self.holds(name) and self.may_see(context, name))
            return reply
        visible = [name for name in names if self.may_see(context, name)]
        remote = [name for name in visible if not self.holds(name)
                  and self._cached(name) is None]
        found = self.find_holders(remote, context) if self.enabled else {}
        for name in names:
            if name in visible and self.holds(name):
                reply.owners.add(stream=name, owner=self.identity, exists=True)
                continue
            handing = self.moves.active(name) if self.moves is not None else None
            if name in visible and handing is not None and handing.state == "removing":
                reply.owners.add(stream=name, owner=handing.target, exists=True)
                continue
            holder = (found.get(name) or self._cached(name)) if name in visible else None
            if holder is not None:
                reply.owners.add(stream=name, owner=holder, exists=True)
            else:
                reply.owners.add(stream=name, owner=self.placement(name), exists=False)
        return reply

    def record_moved(self, stream: str, target: str) -> None:
        """A move's switch: etcd's record of ``stream`` names ``target`` from now on, in a
        transaction guarded by the record's mod_revision (stream_records.py).

        MemberUnavailableError when etcd does not answer or the target is not
        registered: the move stays at its switch and is retried.
        """
        if not self.enabled:
            return
        if self.records is None or self.membership is None:  # a move resumed at start
            raise MemberUnavailableError("etcd", f"stream '{stream}' cannot switch to {target}",
                                         "this member has not joined the cluster in etcd yet")
        target_id = self.membership.id_of(target)
        if target_id is None:
            raise MemberUnavailableError(target, f"stream '{stream}' cannot switch to it",
                                         "not registered in etcd now")
        try:
            self.records.move_leader(stream, self.membership.record.id, target_id)
        except EtcdError as exc:
            raise MemberUnavailableError("etcd", f"the owner record of stream '{stream}' "
                                         "could not be switched", str(exc)) from None
        self._remember(stream, target)

    def check_dead_letter_create(self, name: str) -> None:
        """Return when a shared group's dead-letter stream ``name`` may be created here.

        A dead-letter stream lives with its group's stream (docs/groups.md), so
        the group's member creates it on first use, but never a second stream of
        a name another member holds: then this raises (the dead-lettering is
        retried later, its messages delivered again meanwhile) naming the member,
        so that an operator moves one of them. The upkeep thread that
        dead-letters has no caller, so the members are asked as the cluster
        (``cluster_token``); with auth on and no cluster token they refuse,
        and the stream is created here, as on a single broker.
        """
        if not self.enabled:
            return
        found = self._find_holders([name], self._own_metadata or (
            (metadata_keys.CLUSTER_LOCAL, "1"),), refusals_ok=True)
        holder = found.get(name)
        if holder is not None:
            raise DeadLetterElsewhereError(name, holder, self.identity)

    @contextmanager
    def local_write(self, stream: str) -> Iterator[None]:
        """Around an append to ``stream`` that no client call routed here (a sink commit,
        a dead-letter copy): raises unless it may be written here now, and counts as a
        call on the stream while it runs, so that a move's pause waits for it.

        StreamMovingError while it is being moved; NotOwnerError once it moved
        away and this member does not hold it (a commit of rows staged before
        the move must not create it here again: stage them again at the owner).
        """
        if self.moves is None:
            yield
            return
        target = self.moves.moved_away(stream)
        if target is not None and not self.holds(stream):
            raise NotOwnerError(stream, target, True)
        with self.moves.calling(stream):  # StreamMovingError while paused
            yield

    @contextmanager
    def staging(self, streams: Iterable[str]) -> Iterator[None]:
        """Around a Stage's write of rows for ``streams``: StreamMovingError while one of
        them is drained or paused for a move, and counted meanwhile (move_state.py)."""
        if self.moves is None:
            yield
            return
        with ExitStack() as guards:
            for stream in sorted(set(streams)):
                guards.enter_context(self.moves.staging(stream))
            yield

    def close(self) -> None:
        if self._peers is not None:
            self._peers.close()

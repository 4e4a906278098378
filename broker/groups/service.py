"""GroupService: the gRPC face of consumer groups (cursor and shared models).

Request checking and wire conversion live here; the work is done by
GroupManager and the group objects. Every RPC that reports a position
(OpenConsumer aside) answers only once that position is in SQLite, so what
a client was told survives kill -9. Acks sent on a Subscribe stream have no
answer; they are written within the position writer's interval.

Subscribe and SubscribeBatches share one implementation and run two threads
per call: the handler's generator sends deliveries, and a reader thread
applies the client's credits, acks and nacks. The generator never has more
deliveries out than the client granted credits for, so a slow consumer only
slows itself down. Each time it wakes it takes everything that is ready and
fits the remaining credits; SubscribeBatches sends that as one DeliveryBatch
(one gRPC message, not one per delivery, which would make push delivery
CPU-bound), Subscribe as one message per delivery for old clients.

Access control (docs/broker.md "Security"): consuming through a group
(open, pull, commit, receive, ack, nack, subscribe, describe, list) needs
``read`` on the stream; Seek and DeleteGroup need ``admin``. A shared group
that dead-letters (max_deliver > 0) writes to its dead-letter stream, so the
caller that sets it needs ``write`` there too: a reader must not be able to
copy a stream into another one it could not publish to.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

import grpc
from prometheus_client import Counter

from npstream.broker.auth.access import AccessControl, Right
from npstream.broker.errors import BrokerError, InvalidArgumentError, ShuttingDownError
from npstream.broker.groups.dead_letter import DeadLetterWriter
from npstream.broker.groups.deliveries import Delivered, Grant, delivery_table, grants
from npstream.broker.groups.group_collector import GroupCollector
from npstream.broker.groups.manager import GroupManager, GroupStatus
from npstream.broker.groups.metrics import GroupMetrics
from npstream.broker.groups.shared import SharedGroup
from npstream.broker.groups.shared_config import DEAD_LETTER_SUFFIX, SharedConfig
from npstream.broker.groups.tuning import (
    ARROW_DELIVERIES_MIN_ROWS,
    DEFAULT_PULL_LIMIT,
    DEFAULT_RECEIVE_MAX,
    MAX_PULL_LIMIT,
    MAX_RECEIVE_MAX,
    SUBSCRIBE_POLL_S,
)
from npstream.broker.rpc.registration import add_service
from npstream.broker.rpc.status import rpc_method
from npstream.broker.server.context import BrokerContext
from npstream.proto import metadata_keys, pb, pb_grpc
from npstream.proto.field_ranges import MAX_SUBSCRIBE_CREDITS
from npstream.proto.wire import arrow_stream_buffer, encode_with_arrow_stream, encode_with_bytes

__all__ = ["GroupServicer", "add_to_server"]

log = logging.getLogger(__name__)

# Initial metadata sent once a Subscribe call has joined its group (value: member id).


def _status_pb(status: GroupStatus) -> pb.GroupInfo:
    info = pb.GroupInfo(
        stream=status.stream,
        group=status.group,
        committed_offset=status.committed_offset,
        lag=status.lag,
        members=[pb.GroupMember(member_id=m.member_id, last_seen_ms=m.last_seen_ms,
                                in_flight=m.in_flight) for m in status.members],
        in_flight=status.in_flight,
        dead_lettered=status.dead_lettered,
        kind=status.kind,
    )
    if status.config is not None:
        info.shared_config.CopyFrom(status.config.to_pb())
    if status.removed_unread is not None:
        start, end = status.removed_unread
        info.removed_unread.CopyFrom(pb.OffsetRange(start=start, end=end))
    return info


def _add_deliveries(target: Any, grants: list[Grant]) -> None:
    """Append grants to a repeated Delivery field (built in place: no copy per delivery)."""
    add = target.add
    for grant in grants:
        row = grant.row
        delivery = add(offset=row.offset, id=row.id, value=row.value,
                       timestamp_ms=row.timestamp_ms, attempt=grant.attempt,
                       lease_expires_ms=grant.expires_ms)
        if row.headers:  # half the cost of passing an empty map to add()
            delivery.headers.update(row.headers)
        if row.key is not None:
            delivery.key = row.key


def _ranges(what: str, stream: str,
            ranges: Iterable[pb.OffsetRange]) -> list[tuple[int, int]]:
    """``[start, end)`` pairs of a request; InvalidArgumentError for a reversed or negative one."""
    out = []
    for r in ranges:
        if r.start < 0 or r.end < r.start:
            raise InvalidArgumentError(
                f"{what} on stream '{stream}': range [{r.start}, {r.end}) is not a range of "
                "offsets (0 <= start <= end)")
        out.append((r.start, r.end))
    return out


def _metadata_safe_member(member_id: str) -> str:
    """A Subscribe's member id, which goes back in initial metadata: printable ASCII only.

    gRPC refuses any other character in a metadata value and would end the
    call with INTERNAL ("Invalid metadata"); refuse it as a bad argument
    instead (found by the hostile-input fuzzer).
    """
    if any(not " " <= ch <= "~" for ch in member_id):
        raise InvalidArgumentError(
            f"member_id {member_id!r} must be printable ASCII (it is sent back in the "
            "Subscribe call's metadata)")
    return member_id


def _check_non_negative(what: str, stream: str, **values: int) -> None:
    for name, value in values.items():
        if value < 0:
            raise InvalidArgumentError(f"{what} on stream '{stream}': {name}={value} must be >= 0")


def _bounded(what: str, stream: str, name: str, value: int, default: int, maximum: int) -> int:
    _check_non_negative(what, stream, **{name: value})
    if value > maximum:
        raise InvalidArgumentError(
            f"{what} on stream '{stream}': {name}={value} is above the maximum {maximum}"
        )
    return value or default


class GroupServicer(pb_grpc.GroupServiceServicer):
    def __init__(self, manager: GroupManager, ctx: BrokerContext) -> None:
        self._manager = manager
        self._max_wait_ms = ctx.config.server.max_fetch_wait_ms
        self._stopping = ctx.stopping
        self._access: AccessControl = ctx.access

    def _read(self, context: grpc.ServicerContext, stream: str) -> None:
        self._access.require(context, stream, Right.READ)

    def _shared_access(self, context: grpc.ServicerContext, stream: str,
                       config: pb.SharedGroupConfig) -> None:
        """Read on the stream; write on the dead-letter stream when the group dead-letters."""
        self._read(context, stream)
        if config.max_deliver > 0:
            target = config.dead_letter_stream or stream + DEAD_LETTER_SUFFIX
            self._access.require(context, target, Right.WRITE,
                                 f"dead-letter messages of '{stream}' into it (max_deliver > 0)")

    def _gone(self, context: grpc.ServicerContext) -> Callable[[], bool]:
        """should_stop for long polls: the client left or the broker is stopping."""
        return lambda: self._stopping.is_set() or not context.is_active()

    def _wait_s(self, wait_ms: int, context: grpc.ServicerContext) -> float:
        """Long-poll length: capped by max_fetch_wait and the call's own deadline."""
        wait_s = min(wait_ms, self._max_wait_ms) / 1000
        remaining = context.time_remaining()
        if remaining is not None:
            wait_s = min(wait_s, max(remaining - 0.05, 0.0))
        return wait_s

    def _position(self, stream: str, group: str, offset: int) -> pb.GroupPosition:
        return pb.GroupPosition(stream=stream, group=group, committed_offset=offset)

    # ------------------------------------------------------------ cursor groups

    @rpc_method
    def OpenConsumer(self, request: pb.OpenConsumerRequest,
                     context: grpc.ServicerContext) -> pb.OpenConsumerResponse:
        self._read(context, request.stream)
        start = request.start_from if request.HasField("start_from") else None
        cursor, position, created, ignored = self._manager.open_cursor(
            request.stream, request.group, start)
        return pb.OpenConsumerResponse(
            position=self._position(cursor.stream, cursor.group, position),
            created=created,
            start_from_ignored=ignored,
        )

    @rpc_method
    def Pull(self, request: pb.PullRequest, context: grpc.ServicerContext) -> pb.PullResponse:
        self._read(context, request.stream)
        limit = _bounded("pull", request.stream, "limit", request.limit, DEFAULT_PULL_LIMIT,
                         MAX_PULL_LIMIT)
        _check_non_negative("pull", request.stream, wait_ms=request.wait_ms)
        cursor, stream_log = self._manager.cursor(request.stream, request.group)
        result = cursor.pull(stream_log, limit, self._wait_s(request.wait_ms, context),
                             request.auto_commit, should_stop=self._gone(context))
        self._manager.wait_durable(result.ticket)
        if result.count:
            self._manager.metrics.pulled.inc(result.count)
        return pb.PullResponse(
            batches=[b if isinstance(b, bytes) else bytes(b) for b in result.batches],
            count=result.count,
            next_offset=result.next_offset,
        )

    @rpc_method
    def Commit(self, request: pb.CommitRequest,
               context: grpc.ServicerContext) -> pb.CommitResponse:
        self._read(context, request.stream)
        which = request.WhichOneof("position")
        if which is None:
            raise InvalidArgumentError(
                f"commit on stream '{request.stream}' for group '{request.group}' needs offset "
                "(last processed) or next_offset (next to read)"
            )
        shown = request.offset if which == "offset" else request.next_offset
        next_offset = shown + 1 if which == "offset" else shown
        position, ticket = self._manager.commit(request.stream, request.group, next_offset,
                                                shown)
        self._manager.wait_durable(ticket)
        return pb.CommitResponse(position=self._position(request.stream, request.group,
                                                         position))

    @rpc_method
    def Seek(self, request: pb.SeekRequest, context: grpc.ServicerContext) -> pb.SeekResponse:
        self._access.require(context, request.stream, Right.ADMIN)
        target, ticket = self._manager.seek(request.stream, request.group,
                                            request.to if request.HasField("to") else None)
        self._manager.wait_durable(ticket)
        return pb.SeekResponse(
            position=self._position(request.stream, request.group, target.offset),
            clamped_to_start=target.clamped_to_start,
            clamped_to_end=target.clamped_to_end,
        )

    # ------------------------------------------------------------ admin

    @rpc_method
    def ListGroups(self, request: pb.ListGroupsRequest,
                   context: grpc.ServicerContext) -> pb.ListGroupsResponse:
        self._read(context, request.stream)
        return pb.ListGroupsResponse(
            groups=[_status_pb(s) for s in self._manager.list(request.stream)]
        )

    @rpc_method
    def DescribeGroup(self, request: pb.DescribeGroupRequest,
                      context: grpc.ServicerContext) -> pb.GroupInfo:
        self._read(context, request.stream)
        return _status_pb(self._manager.describe(request.stream, request.group))

    @rpc_method
    def DeleteGroup(self, request: pb.DeleteGroupRequest,
                    context: grpc.ServicerContext) -> pb.DeleteGroupResponse:
        self._access.require(context, request.stream, Right.ADMIN)
        return pb.DeleteGroupResponse(deleted=self._manager.delete(request.stream,
                                                                   request.group))

    # ------------------------------------------------------------ shared groups

    @rpc_method
    def Receive(self, request: pb.ReceiveRequest,
                context: grpc.ServicerContext) -> pb.ReceiveResponse:
        group, config, member, limit, ticket = self._start_receive(request, context)
        grants = group.receive(member, limit, self._wait_s(request.wait_ms, context),
                               config.ack_wait_ms, should_stop=self._gone(context))
        response = pb.ReceiveResponse()
        _add_deliveries(response.deliveries, grants)
        self._manager.wait_durable(ticket)
        return response

    def _start_receive(self, request: pb.ReceiveRequest, context: grpc.ServicerContext,
                       ) -> tuple[SharedGroup, SharedConfig, str, int, int]:
        """What Receive and ReceiveBatch share before leasing: access, the checked limit,
        the group, the member, and the piggybacked acks applied (the position writer's
        ticket, 0: none)."""
        self._shared_access(context, request.stream, request.config)
        limit = _bounded("receive", request.stream, "max_messages", request.max_messages,
                         DEFAULT_RECEIVE_MAX, MAX_RECEIVE_MAX)
        _check_non_negative("receive", request.stream, wait_ms=request.wait_ms)
        group, config = self._manager.shared(request.stream, request.group, request.config)
        member = request.member_id or context.peer()
        ticket = 0
        if request.ack_ranges:
            _count, _committed, ticket = group.ack(
                [], member, _ranges("ack", request.stream, request.ack_ranges))
        return group, config, member, limit, ticket

    @rpc_method
    def ReceiveBatch(self, request: pb.ReceiveRequest, context: grpc.ServicerContext) -> bytes:
        """Receive, with the deliveries as one Arrow IPC stream (DELIVERY_SCHEMA).

        Returns the reply's wire bytes (registered with a raw response): the
        Arrow buffer is appended to the small fields, not copied into a message.
        """
        group, config, member, limit, ticket = self._start_receive(request, context)
        table = group.receive_batch(member, limit, self._wait_s(request.wait_ms, context),
                                    config.ack_wait_ms, should_stop=self._gone(context))
        head = pb.ReceiveBatchResponse(count=table.num_rows)
        self._manager.wait_durable(ticket)
        if not table.num_rows:
            return head.SerializeToString()
        return encode_with_arrow_stream(head, "arrow_stream", table)

    @rpc_method
    def Ack(self, request: pb.AckRequest, context: grpc.ServicerContext) -> pb.AckResponse:
        self._read(context, request.stream)
        group = self._manager.existing_shared(request.stream, request.group)
        count, committed, ticket = group.ack(list(request.offsets), request.member_id or None,
                                             _ranges("ack", request.stream, request.ranges))
        self._manager.wait_durable(ticket)
        return pb.AckResponse(acked=count,
                              position=self._position(group.stream, group.group, committed))

    @rpc_method
    def Nack(self, request: pb.NackRequest, context: grpc.ServicerContext) -> pb.NackResponse:
        self._read(context, request.stream)
        _check_non_negative("nack", request.stream, delay_ms=request.delay_ms)
        group = self._manager.existing_shared(request.stream, request.group)
        return pb.NackResponse(nacked=group.nack(
            list(request.offsets), request.member_id or None, request.delay_ms,
            _ranges("nack", request.stream, request.ranges)))

    @rpc_method
    def Subscribe(self, request_iterator: Iterator[pb.SubscribeRequest],
                  context: grpc.ServicerContext) -> Iterator[pb.Delivery]:
        """The unbatched form: one stream message per delivery (clients before batching)."""
        sent = self._manager.metrics.subscribe_messages
        with contextlib.closing(self._subscribe(request_iterator, context)) as ready:
            for _first, delivered, _count in ready:
                batch = pb.DeliveryBatch()
                _add_deliveries(batch.deliveries, grants(delivered))
                for delivery in batch.deliveries:
                    sent.inc()
                    yield delivery

    @rpc_method
    def SubscribeBatches(self, request_iterator: Iterator[pb.SubscribeRequest],
                         context: grpc.ServicerContext) -> Iterator[bytes]:
        """Everything ready that fits the credits in one stream message (wire bytes).

        With ``open.arrow_deliveries`` a batch of ARROW_DELIVERIES_MIN_ROWS
        or more is one Arrow IPC stream (DELIVERY_SCHEMA), appended to the
        message without a copy into it: no protobuf message per delivery on
        either side. Smaller ones stay protobuf, whose cost is per delivery
        where Arrow's is mostly fixed (a lone message's latency).
        """
        sent = self._manager.metrics.subscribe_messages
        with contextlib.closing(self._subscribe(request_iterator, context)) as ready:
            for first, delivered, count in ready:
                sent.inc()
                if first.open.arrow_deliveries and count >= ARROW_DELIVERIES_MIN_ROWS:
                    table = delivery_table(delivered)
                    yield encode_with_bytes(pb.DeliveryBatch(count=table.num_rows),
                                            "arrow_stream", [arrow_stream_buffer(table)])
                else:
                    batch = pb.DeliveryBatch()
                    _add_deliveries(batch.deliveries, grants(delivered))
                    yield batch.SerializeToString()

    def _subscribe(self, request_iterator: Iterator[pb.SubscribeRequest],
                   context: grpc.ServicerContext,
                   ) -> Generator[tuple[pb.SubscribeRequest, list[Delivered], int], None, None]:
        """The leases of one Subscribe call as they become ready (never empty).

        Each with the call's opening request and the number of deliveries.
        """
        first = next(request_iterator, None)
        if first is None:
            return
        if not first.HasField("open"):
            raise InvalidArgumentError(
                "the first SubscribeRequest must carry `open` (stream, group, member_id, config)"
            )
        self._shared_access(context, first.open.stream, first.open.config)
        group, config = self._manager.shared(first.open.stream, first.open.group,
                                             first.open.config)
        member = _metadata_safe_member(first.open.member_id) or context.peer()
        session = _SubscribeSession(group, member, self._stopping,
                                    self._manager.metrics.subscribe_requests)
        session.apply(first)
        context.add_callback(session.end)
        reader = threading.Thread(target=session.read, args=(request_iterator,), daemon=True,
                                  name=f"npstream-subscribe-{member}")
        group.connect(member)
        try:
            # the client's handshake
            context.send_initial_metadata(((metadata_keys.MEMBER_ID, member),))
            log.info("member '%s' subscribed to group '%s' on stream '%s'", member, group.group,
                     group.stream)
            reader.start()
            while True:
                if self._stopping.is_set():
                    raise ShuttingDownError(
                        "the broker is shutting down; subscriptions reconnect when it is back")
                # Rights are those in force now: a tokens reload that takes the
                # right away ends the subscription within one poll.
                self._shared_access(context, first.open.stream, first.open.config)
                credits = session.wait_for_credits(SUBSCRIBE_POLL_S)
                if credits is None:
                    break
                if credits == 0:
                    continue
                # receive returns as soon as anything is deliverable, with everything
                # that is (up to the credits): low latency when idle, big batches when busy.
                delivered = group.lease(member, min(credits, MAX_RECEIVE_MAX),
                                        SUBSCRIBE_POLL_S, config.ack_wait_ms,
                                        should_stop=session.stopping)
                if delivered:
                    count = sum(d.size for d in delivered)
                    session.spend(count)
                    yield first, delivered, count
        finally:
            session.end()
            group.disconnect(member)
            log.info("member '%s' left group '%s' on stream '%s'", member, group.group,
                     group.stream)


class _SubscribeSession:
    """Credits and the client's acks/nacks of one Subscribe call."""

    def __init__(self, group: SharedGroup, member: str, broker_stopping: threading.Event,
                 requests_counter: Counter) -> None:
        self._group = group
        self._requests_counter = requests_counter
        self._member = member
        self._broker_stopping = broker_stopping
        self._cond = threading.Condition()
        self._credits = 0
        self._ended = False
        self._error: BrokerError | None = None

    def apply(self, request: pb.SubscribeRequest) -> None:
        self._requests_counter.inc()
        stream = self._group.stream
        if request.ack_offsets or request.ack_ranges:
            self._group.ack(list(request.ack_offsets), self._member,
                            _ranges("ack", stream, request.ack_ranges), waited=False)
        if request.nack_offsets or request.nack_ranges:
            self._group.nack(list(request.nack_offsets), self._member, request.nack_delay_ms,
                             _ranges("nack", stream, request.nack_ranges))
        if request.credits:
            # Only the sender waits for credits (and only outside group.receive, which
            # it enters with credits in hand), so the group's waiters need no wake-up.
            # Unused credits are capped (field_ranges.MAX_SUBSCRIBE_CREDITS): what a
            # call may be sent ahead stays bounded however many requests grant them.
            with self._cond:
                self._credits = min(self._credits + request.credits, MAX_SUBSCRIBE_CREDITS)
                self._cond.notify_all()

    def read(self, requests: Iterator[pb.SubscribeRequest]) -> None:
        """Reader thread: apply every client message until the client half-closes."""
        try:
            for request in requests:
                self.apply(request)
        except BrokerError as exc:
            with self._cond:
                self._error = exc
        except Exception as exc:  # the call was cancelled or broke: nothing to report to
            log.debug("subscribe stream of member '%s' ended: %s", self._member, exc)
        self.end()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()
        self._group.wake()

    def stopping(self) -> bool:
        return self._ended or self._broker_stopping.is_set()

    def wait_for_credits(self, timeout: float) -> int | None:
        """Credits available (0 after timeout), None when the call is over."""
        with self._cond:
            self._cond.wait_for(lambda: self._credits > 0 or self._ended, timeout)
            if self._error is not None:
                raise self._error
            if self._ended:
                return None
            return self._credits

    def spend(self, count: int) -> None:
        with self._cond:
            self._credits -= count


def group_manager(ctx: BrokerContext) -> GroupManager:
    """The broker's GroupManager, wired to the context: the cluster's dead-letter checks,
    the broker's metrics, and told of streams deleted or leaving for another member."""
    dead_letters = DeadLetterWriter(ctx.registry, ctx.cluster.check_dead_letter_create,
                                    ctx.cluster.local_write)
    metrics = GroupMetrics(ctx.metrics.registry, count_out=ctx.metrics.count_out)
    manager = GroupManager(ctx.registry, ctx.metadata, dead_letters, metrics)
    ctx.on_stream_deleted.append(manager.on_stream_deleted)
    ctx.on_stream_leaving.append(manager.release_stream)
    ctx.metrics.registry.register(
        GroupCollector(manager, ctx.config.metrics.metrics_group_gauges_max))
    return manager


def add_to_server(server: grpc.Server, ctx: BrokerContext) -> GroupManager:
    """Register GroupService on ``server``; the returned manager is closed at shutdown."""
    manager = group_manager(ctx)
    add_service(server, "GroupService", GroupServicer(manager, ctx),
                raw_responses={"ReceiveBatch", "SubscribeBatches"})
    return manager

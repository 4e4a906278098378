"""GroupService as typed calls: the one place on the client side that names its methods.

The group code (``npstream.groups``) and the Spark reader build on these
instead of ``client.call(lambda s: s.GroupService.X, request)``, so a
method is named once, a caller sees the response type it gets back, and the
per-RPC call rules live with the RPC: the timeout of a long poll grows by its
wait, an auto-commit Pull is never resent (a retry would skip messages).

Arguments are not checked here; the public methods that take them from users
(``npstream.groups``) check names and values first.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from npstream.client.checks import checked_int, checked_offset, checked_wait_ms
from npstream.errors import NpstreamError
from npstream.proto import pb
from npstream.proto.wire import split_bytes_field

if TYPE_CHECKING:
    from npstream.client.connection import StreamingCall
    from npstream.client.core import ClientCore

__all__ = [
    "ack",
    "commit",
    "delete_group",
    "describe_group",
    "list_groups",
    "nack",
    "open_consumer",
    "pull",
    "receive",
    "seek",
    "subscribe_batches",
]



# ---------------------------------------------------------------- cursor groups

def open_consumer(client: ClientCore, stream: str, group: str,
                  start_from: pb.StartFrom | None = None) -> pb.OpenConsumerResponse:
    """Open (and create, at ``start_from``, if new) a cursor group."""
    request = pb.OpenConsumerRequest(stream=stream, group=group)
    if start_from is not None:
        request.start_from.CopyFrom(start_from)
    response: pb.OpenConsumerResponse = client.call(lambda s: s.GroupService.OpenConsumer, request)
    return response


def pull(client: ClientCore, stream: str, group: str, *, limit: int, wait: float,
         auto_commit: bool) -> pb.PullResponse:
    """The next messages after the group's position; ``wait`` seconds long-polls."""
    response: pb.PullResponse = client.call(
        lambda s: s.GroupService.Pull,
        pb.PullRequest(stream=stream, group=group,
                       limit=checked_int("limit", limit, "PullRequest.limit"),
                       wait_ms=checked_wait_ms("wait", wait, "PullRequest.wait_ms"),
                       auto_commit=auto_commit),
        timeout=client.timeout + wait,
        idempotent=not auto_commit,  # a retried auto-commit pull would skip messages
    )
    return response


def commit(client: ClientCore, stream: str, group: str, *, offset: int | None = None,
           next_offset: int | None = None) -> pb.CommitResponse:
    """Move the group past ``offset``, or to ``next_offset`` (give one of them)."""
    request = pb.CommitRequest(stream=stream, group=group)
    if next_offset is not None:
        request.next_offset = checked_offset("next_offset", next_offset,
                                             "CommitRequest.next_offset")
    elif offset is not None:
        request.offset = checked_int("offset", offset, "CommitRequest.offset")
    response: pb.CommitResponse = client.call(lambda s: s.GroupService.Commit, request)
    return response


def seek(client: ClientCore, stream: str, group: str, to: pb.StartFrom) -> pb.SeekResponse:
    """Move the group to ``to`` (clamped to the stream)."""
    response: pb.SeekResponse = client.call(
        lambda s: s.GroupService.Seek, pb.SeekRequest(stream=stream, group=group, to=to))
    return response


# ---------------------------------------------------------------- any group

def list_groups(client: ClientCore, stream: str) -> pb.ListGroupsResponse:
    """Every group of the stream."""
    response: pb.ListGroupsResponse = client.call(
        lambda s: s.GroupService.ListGroups, pb.ListGroupsRequest(stream=stream))
    return response


def describe_group(client: ClientCore, stream: str, group: str) -> pb.GroupInfo:
    """One group's state; GroupNotFound when it does not exist."""
    response: pb.GroupInfo = client.call(
        lambda s: s.GroupService.DescribeGroup, pb.DescribeGroupRequest(stream=stream, group=group))
    return response


def delete_group(client: ClientCore, stream: str, group: str) -> pb.DeleteGroupResponse:
    """Delete the group's position, settings and leases."""
    response: pb.DeleteGroupResponse = client.call(
        lambda s: s.GroupService.DeleteGroup, pb.DeleteGroupRequest(stream=stream, group=group))
    return response


# ---------------------------------------------------------------- shared groups

def receive(client: ClientCore, stream: str, group: str, *, member_id: str, max_messages: int,
            wait: float, config: pb.SharedGroupConfig) -> pb.ReceiveResponse:
    """Lease up to ``max_messages``; ``wait`` seconds long-polls."""
    response: pb.ReceiveResponse = client.call(
        lambda s: s.GroupService.Receive,
        pb.ReceiveRequest(stream=stream, group=group, member_id=member_id,
                          max_messages=checked_int("max_messages", max_messages,
                                                   "ReceiveRequest.max_messages"),
                          wait_ms=checked_wait_ms("wait", wait, "ReceiveRequest.wait_ms"),
                          config=config),
        timeout=client.timeout + wait,
    )
    return response


def receive_batch(client: ClientCore, stream: str, group: str, *, member_id: str,
                  max_messages: int, wait: float, config: pb.SharedGroupConfig,
                  ack_ranges: Sequence[tuple[int, int]] = ()) -> memoryview | None:
    """``receive`` with the deliveries as one Arrow IPC stream (DELIVERY_SCHEMA).

    Returns the stream as a view into the reply's bytes (not copied out of a
    parsed message), None when nothing was leased. ``ack_ranges`` are acked
    first, in the same round trip (and durable when it replies; acks are
    idempotent, so a retried call acks nothing twice).
    """
    reply = client.call_raw_reply(
        lambda s: s.GroupService.ReceiveBatch,
        pb.ReceiveRequest(stream=stream, group=group, member_id=member_id,
                          max_messages=checked_int("max_messages", max_messages,
                                                   "ReceiveRequest.max_messages"),
                          wait_ms=checked_wait_ms("wait", wait, "ReceiveRequest.wait_ms"),
                          config=config, ack_ranges=_ranges(ack_ranges)),
        timeout=client.timeout + wait,
    )
    try:
        _head, streams = split_bytes_field(reply, pb.ReceiveBatchResponse, "arrow_stream")
    except DecodeError as exc:
        raise NpstreamError(f"malformed ReceiveBatch reply from the broker: {exc}") from None
    return streams[-1] if streams else None


def _ranges(ranges: Sequence[tuple[int, int]]) -> list[pb.OffsetRange]:
    return [pb.OffsetRange(start=checked_offset("range start", start, "OffsetRange.start"),
                           end=checked_offset("range end", end, "OffsetRange.end"))
            for start, end in ranges]


def _offsets(offsets: Sequence[int], field: str) -> Sequence[int]:
    """``offsets`` when its lowest and highest are in ``field``'s range (no per-item loop)."""
    if len(offsets):
        checked_offset("offsets", min(offsets), field)
        checked_offset("offsets", max(offsets), field)
    return offsets


def ack(client: ClientCore, stream: str, group: str, offsets: Sequence[int],
        member_id: str = "", ranges: Sequence[tuple[int, int]] = ()) -> pb.AckResponse:
    """Settle leases as done: ``offsets`` and every offset of the ``[start, end)`` ranges."""
    response: pb.AckResponse = client.call(lambda s: s.GroupService.Ack, pb.AckRequest(
        stream=stream, group=group, offsets=_offsets(offsets, "AckRequest.offsets"),
        member_id=member_id, ranges=_ranges(ranges)))
    return response


def nack(client: ClientCore, stream: str, group: str, offsets: Sequence[int], *,
         delay_ms: int, member_id: str = "",
         ranges: Sequence[tuple[int, int]] = ()) -> pb.NackResponse:
    """Settle leases as not done: redeliver after ``delay_ms``."""
    response: pb.NackResponse = client.call(lambda s: s.GroupService.Nack, pb.NackRequest(
        stream=stream, group=group, offsets=_offsets(offsets, "NackRequest.offsets"),
        delay_ms=checked_int("delay_ms", delay_ms, "NackRequest.delay_ms"),
        member_id=member_id, ranges=_ranges(ranges)))
    return response


def subscribe_batches(client: ClientCore,
                      requests: Iterator[pb.SubscribeRequest]) -> StreamingCall:
    """Open a push subscription call; its responses are ``pb.DeliveryBatch``es. Not retried.

    The first request (``open``) names the stream: the call goes to the
    broker that holds it (a cluster's member; ``ClientCore.stream``).
    """
    first = next(requests)
    # GroupService.Subscribe (one message per delivery) is kept on the broker for
    # older clients.
    return client.stream(lambda s: s.GroupService.SubscribeBatches,
                         itertools.chain([first], requests),
                         stream=first.open.stream or None)

"""Groups as objects: list, describe and delete the consumer groups of a stream.

``GroupInfo`` mirrors pb.GroupInfo (times in epoch ms, durations converted
to seconds in ``settings`` for the user-facing view) and has a JSON-ready
``to_dict`` used by ``npstream groups describe --json``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from npstream.client import group_rpc
from npstream.client.values import ms_to_iso
from npstream.errors import InvalidArgument
from npstream.proto import pb
from npstream.proto.names import validate_group_name, validate_stream_name
from npstream.proto.units import datetime_from_ms

if TYPE_CHECKING:
    from npstream.client.client import Client

__all__ = ["GroupInfo", "GroupMember", "SharedSettings", "delete_group", "describe_group",
           "list_groups"]



@dataclass(frozen=True)
class GroupMember:
    """A consumer in a shared group: who, when last heard from, leases it holds."""

    member_id: str
    last_seen_ms: int
    in_flight: int

    @property
    def last_seen(self) -> dt.datetime:
        return datetime_from_ms(self.last_seen_ms)


@dataclass(frozen=True)
class SharedSettings:
    """Settings of a shared group (seconds, as ``client.subscribe`` takes them)."""

    ack_wait: float
    max_deliver: int  # 0 = unlimited
    backoff: list[float]
    dead_letter_stream: str
    ordering: str = "none"  # "key": at most one unfinished message per key

    @classmethod
    def from_pb(cls, message: pb.SharedGroupConfig) -> SharedSettings:
        return cls(
            ack_wait=message.ack_wait_ms / 1000,
            max_deliver=message.max_deliver,
            backoff=[b / 1000 for b in message.backoff_ms],
            dead_letter_stream=message.dead_letter_stream,
            ordering="key" if message.ordering == pb.ORDERING_KEY else "none",
        )


@dataclass(frozen=True)
class GroupInfo:
    """A group's state: position, lag, members, in-flight and dead-lettered counts.

    ``committed_offset`` is the next offset the group reads (cursor groups)
    or the lowest offset not yet acked (shared groups); ``lag`` is
    ``end_offset - committed_offset``. ``kind`` is "cursor", "shared", or ""
    for a group only positioned by a seek so far. ``removed_unread``: offsets
    ``(start, end)`` that retention or delete_messages removed before a cursor
    group read them (None when none); it stays until the group's position
    next moves (a pull past it, a commit or a seek).
    """

    stream: str
    group: str
    kind: str
    committed_offset: int
    lag: int
    in_flight: int
    dead_lettered: int
    members: list[GroupMember] = field(default_factory=list)
    settings: SharedSettings | None = None
    removed_unread: tuple[int, int] | None = None

    @classmethod
    def from_pb(cls, message: pb.GroupInfo) -> GroupInfo:
        return cls(
            stream=message.stream,
            group=message.group,
            kind=message.kind,
            committed_offset=message.committed_offset,
            lag=message.lag,
            in_flight=message.in_flight,
            dead_lettered=message.dead_lettered,
            members=[GroupMember(m.member_id, m.last_seen_ms, m.in_flight)
                     for m in message.members],
            settings=(SharedSettings.from_pb(message.shared_config)
                      if message.HasField("shared_config") else None),
            removed_unread=((message.removed_unread.start, message.removed_unread.end)
                            if message.HasField("removed_unread") else None),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; members also get ``last_seen`` as ISO-8601."""
        data = asdict(self)
        for member in data["members"]:
            member["last_seen"] = ms_to_iso(member["last_seen_ms"])
        return data


def _check(stream: str, group: str | None = None) -> None:
    try:
        validate_stream_name(stream)
        if group is not None:
            validate_group_name(group)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def list_groups(client: Client, stream: str) -> list[GroupInfo]:
    """Every group of the stream, by name."""
    _check(stream)
    response = group_rpc.list_groups(client, stream)
    return [GroupInfo.from_pb(g) for g in response.groups]


def describe_group(client: Client, stream: str, group: str) -> GroupInfo:
    """One group; GroupNotFound when it does not exist."""
    _check(stream, group)
    return GroupInfo.from_pb(group_rpc.describe_group(client, stream, group))


def delete_group(client: Client, stream: str, group: str) -> bool:
    """Delete the group (position, settings, leases); False when there was none."""
    _check(stream, group)
    return bool(group_rpc.delete_group(client, stream, group).deleted)

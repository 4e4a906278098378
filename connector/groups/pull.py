"""Pulling from a shared group: ``client.receive`` leases a handful of messages per call.

The simple way to consume a shared group, for batch jobs and for consumers
that do not want threads: each call is one long-polling Receive, and each
lease it returns settles with its own unary call (or many at once with
``ack_leases``). Push delivery (``npstream.groups.subscription``) is faster
for a steady flow; both can serve one group at the same time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from npstream.client import group_rpc
from npstream.groups.leases import (
    Lease,
    check_receive,
    default_member_id,
    shared_group_config,
    unary_settler,
)

if TYPE_CHECKING:
    from npstream.client.client import Client

__all__ = ["receive"]


def receive(
    client: Client,
    stream: str,
    group: str,
    max: int = 10,
    *,
    wait: float = 0.0,
    ack_wait: float = 30.0,
    max_deliver: int = 0,
    backoff: Sequence[float] | None = None,
    dead_letter_stream: str | None = None,
    ordering: str | None = None,
    member_id: str | None = None,
) -> list[Lease]:
    """Lease up to ``max`` messages of the shared group (created on first use).

    Redeliveries that are due come first, then new messages in offset order.
    ``wait`` seconds long-polls when there is nothing to deliver.
    """
    config = shared_group_config(stream, ack_wait, max_deliver, backoff, dead_letter_stream,
                                 ordering)
    check_receive(group, max, wait)
    member = member_id or default_member_id()
    response = group_rpc.receive(client, stream, group, member_id=member, max_messages=max,
                                 wait=wait, config=config)
    settle = unary_settler(client, member)
    return [Lease.from_pb(stream, group, d, settle) for d in response.deliveries]

"""Pulling from a shared group: ``client.receive`` leases a handful of messages per call.

The simple way to consume a shared group, for batch jobs and for consumers
that do not want threads: each call is one long-polling Receive, and each
lease it returns settles with its own unary call (or many at once with
``ack_leases``). Push delivery (``npstream.groups.subscription``) is faster
for a steady flow; both can serve one group at the same time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from npstream.client import group_rpc
from npstream.groups.leases import (
    Lease,
    check_receive,
    default_member_id,
    shared_group_config,
    unary_settler,
)
from npstream.groups.options import GroupOptions, group_options

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
    options: GroupOptions | None = None,
    **keywords: Any,
) -> list[Lease]:
    """Lease up to ``max`` messages of the shared group (created on first use).

    Redeliveries that are due come first, then new messages in offset order.
    ``wait`` seconds long-polls when there is nothing to deliver.
    """
    settings = group_options(options, keywords, "receive")
    config = shared_group_config(stream, settings)
    member_id = settings.member_id
    check_receive(group, max, wait)
    member = member_id or default_member_id()
    response = group_rpc.receive(client, stream, group, member_id=member, max_messages=max,
                                 wait=wait, config=config)
    settle = unary_settler(client, member)
    return [Lease.from_pb(stream, group, d, settle) for d in response.deliveries]

"""Batches of shared-group deliveries: ``client.receive_batch`` and ``LeaseBatch``.

``receive`` hands out one ``Lease`` object per message and settles each with
its own offset; at thousands of messages a second that per-message Python is
what bounds a consumer (issue 16). ``receive_batch`` leases up to ``max``
messages with one ReceiveBatch call whose reply is one Arrow batch
(DELIVERY_SCHEMA: the message columns plus ``attempt`` and
``lease_expires``), and ``LeaseBatch`` settles them as offset ranges: an
``ack()`` of a whole batch is one small request however many messages it
holds. Nothing here loops over rows in Python except to build the ranges of
a partial settle.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from npstream.client import group_rpc
from npstream.errors import InvalidArgument
from npstream.groups.leases import check_receive, default_member_id, shared_group_config
from npstream.groups.options import GroupOptions, group_options
from npstream.proto import pb
from npstream.proto.schema import DELIVERY_SCHEMA
from npstream.proto.units import parse_duration_ms

if TYPE_CHECKING:
    from npstream.client.client import Client

__all__ = ["LeaseBatch", "lease_batch", "offset_ranges", "receive_batch"]


def offset_ranges(offsets: np.ndarray) -> list[tuple[int, int]]:
    """Sorted ``[start, end)`` runs of distinct offsets (one per gap), column-wise."""
    if not len(offsets):
        return []
    steps = np.diff(offsets)
    # Sorted and distinct already (a whole batch of fresh deliveries): np.unique hashes
    # or sorts every offset, ~4% of a receive_batches consumer's CPU at 1 KB messages.
    ordered = offsets if (steps > 0).all() else np.unique(offsets)
    breaks = np.flatnonzero(np.diff(ordered) != 1) + 1
    starts = ordered[np.concatenate(([0], breaks))]
    ends = ordered[np.concatenate((breaks - 1, [len(ordered) - 1]))] + 1
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


class LeaseBatch:
    """The deliveries of one ``receive_batch`` call; settle all, or some by offset.

    ``table`` is a pyarrow Table in DELIVERY_SCHEMA (``offset, id, key,
    value, timestamp, headers, attempt, lease_expires``; a typed stream's
    values as JSON bytes). ``ack()``/``nack()`` without offsets settle every
    message not settled yet; with offsets, those of them that are in the batch
    and unsettled. Each returns how many the broker counted (leases that were
    still live); settling a message twice is a no-op, as for ``Lease``.
    """

    def __init__(self, client: Client, stream: str, group: str, member_id: str,
                 table: pa.Table) -> None:
        self.stream = stream
        self.group = group
        self.member_id = member_id
        self.table = table
        self._client = client
        self._offsets = table.column("offset").to_numpy()
        self._open = np.ones(len(self._offsets), dtype=bool)

    def __len__(self) -> int:
        return self.table.num_rows

    def __repr__(self) -> str:
        return (f"LeaseBatch(stream={self.stream!r}, group={self.group!r}, "
                f"messages={len(self)}, unsettled={int(self._open.sum())})")

    @property
    def offsets(self) -> np.ndarray:
        """The offsets of the batch, in delivery order (int64)."""
        return self._offsets

    @property
    def unsettled(self) -> int:
        return int(self._open.sum())

    def _take(self, offsets: Iterable[int] | None) -> list[tuple[int, int]]:
        """Ranges of the given (else all) unsettled offsets of the batch; marks them settled."""
        if offsets is None:
            chosen = self._open.copy()
        else:
            wanted = np.fromiter(offsets, dtype=np.int64)
            chosen = self._open & np.isin(self._offsets, wanted)
        self._open &= ~chosen
        return offset_ranges(self._offsets[chosen])

    def ack(self, offsets: Iterable[int] | None = None) -> int:
        """Done: these messages (default: every unsettled one) are not delivered again."""
        ranges = self._take(offsets)
        if not ranges:
            return 0
        return group_rpc.ack(self._client, self.stream, self.group, [],
                             member_id=self.member_id, ranges=ranges).acked

    def nack(self, offsets: Iterable[int] | None = None, delay: float = 0) -> int:
        """Not done: redeliver these (default: every unsettled one) now or after ``delay`` s."""
        try:
            delay_ms = parse_duration_ms(delay)
        except ValueError as exc:
            raise InvalidArgument(f"nack delay: {exc}") from None
        ranges = self._take(offsets)
        if not ranges:
            return 0
        return group_rpc.nack(self._client, self.stream, self.group, [], delay_ms=delay_ms,
                              member_id=self.member_id, ranges=ranges).nacked


def receive_batch(
    client: Client,
    stream: str,
    group: str,
    max: int = 1000,
    *,
    wait: float = 0.0,
    options: GroupOptions | None = None,
    ack: LeaseBatch | None = None,
    **keywords: Any,
) -> LeaseBatch:
    """Lease up to ``max`` messages of the shared group as one batch (see the module doc).

    The same group, settings and rules as ``receive`` (redeliveries first,
    ``wait`` seconds of long poll); an empty batch when nothing came.
    ``ack``: a previous batch of this group whose unsettled messages are
    acked by the same call, before anything is leased (one round trip per
    batch instead of two; durable when the call returns, as ``ack()``).
    """
    settings = group_options(options, keywords, "receive_batch")
    config = shared_group_config(stream, settings)
    member_id = settings.member_id
    check_receive(group, max, wait)
    if ack is not None and (ack.stream, ack.group) != (stream, group):
        raise InvalidArgument(f"ack= is a batch of group '{ack.group}' on stream "
                              f"'{ack.stream}', not of group '{group}' on '{stream}'")
    member = member_id or (ack.member_id if ack is not None else default_member_id())
    return lease_batch(client, stream, group, member, max, wait, config,
                       ack._take(None) if ack is not None else ())


def lease_batch(client: Client, stream: str, group: str, member: str, max: int, wait: float,
                config: pb.SharedGroupConfig,
                ack_ranges: Sequence[tuple[int, int]]) -> LeaseBatch:
    """One ReceiveBatch call with arguments already checked: ``ack_ranges``, then a lease."""
    arrow_stream = group_rpc.receive_batch(
        client, stream, group, member_id=member, max_messages=max, wait=wait, config=config,
        ack_ranges=ack_ranges)
    if arrow_stream is not None:  # the table's buffers point into the reply: no copy
        table = pa.ipc.open_stream(pa.py_buffer(arrow_stream)).read_all()
    else:
        table = DELIVERY_SCHEMA.empty_table()
    return LeaseBatch(client, stream, group, member, table)

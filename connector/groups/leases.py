"""Shared-group leases: what a consumer holds for one delivery, and how it is settled.

Both ways of consuming a shared group (pull: ``npstream.groups.pull``; push:
``npstream.groups.subscription``) hand out the same ``Lease`` and take the
same group settings, so the lease, the settings check and the unary way of
settling live here, under neither. A lease only knows a settle function: a
pulled lease acks with a unary call, a pushed one rides its subscription's
stream (and falls back to the unary call when that stream is gone).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from npstream.client import group_rpc
from npstream.client.checks import checked_int, checked_wait_ms
from npstream.errors import InvalidArgument
from npstream.groups.options import GroupOptions
from npstream.proto import pb
from npstream.proto.names import validate_group_name, validate_stream_name
from npstream.proto.units import datetime_from_ms, parse_duration_ms

if TYPE_CHECKING:
    from npstream.client.client import Client

__all__ = [
    "LEASE_INDEX",
    "LEASE_OFFSET",
    "LEASE_STATES",
    "Lease",
    "Settle",
    "ack_leases",
    "check_group",
    "check_receive",
    "default_member_id",
    "shared_group_config",
    "unary_settler",
]


# How a lease is settled: settle(lease, "ack" | "nack", delay_ms).
Settle = Callable[["Lease", str, int], None]


def default_member_id() -> str:
    """"host-pid": one member per process for receive() unless member_id is given."""
    return f"{socket.gethostname()}-{os.getpid()}"


# ordering= of receive/receive_batch/subscribe -> the wire enum; None keeps the group's.
ORDERINGS = {None: pb.ORDERING_UNSPECIFIED, "none": pb.ORDERING_NONE, "key": pb.ORDERING_KEY}


def shared_group_config(stream: str, options: GroupOptions) -> pb.SharedGroupConfig:
    """The group settings of a receive or subscribe call, checked before any round trip.

    ``options.ordering``: "key" (at most one unfinished message per key,
    redelivered first), "none", or None to keep what the group has
    (unordered when new).
    """
    ack_wait, max_deliver, ordering = options.ack_wait, options.max_deliver, options.ordering
    dead_letter_stream = options.dead_letter_stream
    try:
        validate_stream_name(stream)
        ack_wait_ms = parse_duration_ms(ack_wait)
        backoff_ms = [parse_duration_ms(b) for b in (options.backoff or ())]
        if dead_letter_stream is not None:
            validate_stream_name(dead_letter_stream)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    if ack_wait_ms < 1:
        raise InvalidArgument(f"ack_wait={ack_wait!r} must be at least 1 ms")
    if isinstance(max_deliver, bool) or not isinstance(max_deliver, int) or max_deliver < 0:
        raise InvalidArgument(f"max_deliver={max_deliver!r} must be an int >= 0 (0 = unlimited)")
    if ordering not in ORDERINGS:
        raise InvalidArgument(f"ordering={ordering!r}: use 'key', 'none' or None (keep the "
                              "group's)")
    return pb.SharedGroupConfig(ack_wait_ms=ack_wait_ms, max_deliver=max_deliver,
                                backoff_ms=backoff_ms,
                                dead_letter_stream=dead_letter_stream or "",
                                ordering=ORDERINGS[ordering])


def check_receive(group: str, max: int, wait: float) -> None:
    """InvalidArgument for a bad group name, ``max`` or ``wait`` of receive/receive_batch."""
    check_group(group)
    if max < 1:
        raise InvalidArgument(f"max={max} must be >= 1")
    checked_int("max", max, "ReceiveRequest.max_messages")
    checked_wait_ms("wait", wait, "ReceiveRequest.wait_ms")


def check_group(group: str) -> None:
    """InvalidArgument unless ``group`` is a valid group name."""
    try:
        validate_group_name(group)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


# Where a Lease keeps what it holds (it is a tuple: see the class docstring). The
# subscription's hot path reads the offset and the settled state by index.
_STREAM, _GROUP, _OFFSET, _ID, _KEY, _VALUE, _HEADERS, _TIMESTAMP, _ATTEMPT, _EXPIRES = range(10)
_SETTLE, _STATES, _INDEX = 10, 11, 12
LEASE_OFFSET, LEASE_STATES, LEASE_INDEX = _OFFSET, _STATES, _INDEX
_FIELDS = ("stream", "group", "offset", "id", "key", "value", "headers", "timestamp_ms",
           "attempt", "lease_expires_ms")


class Lease(tuple):
    """One delivery of one message; settle it with ``ack()`` or ``nack(delay)``.

    ``attempt`` is 1 on the first delivery. ``lease_expires_ms`` is when the
    broker gives the message to someone else unless it is settled.
    Settling twice is a no-op. ``settled`` is ``""``, ``"ack"`` or ``"nack"``.

    Why a tuple: a push subscription makes one Lease per message, and a
    tuple subclass is built in C (``tuple.__new__`` over zipped columns, no
    ``__init__`` run), at a third of what a dataclass instance cost; its fields
    are read-only properties. What is settled lives in a list shared by the
    leases of one delivery batch (one slot each), so settling allocates
    nothing. A Lease compares and hashes by identity, as before.
    """

    __slots__ = ()
    # _FIELDS + "settled", spelled out: mypy checks match statements only against literals.
    __match_args__ = ("stream", "group", "offset", "id", "key", "value", "headers",
                      "timestamp_ms", "attempt", "lease_expires_ms", "settled")

    if TYPE_CHECKING:
        stream: str
        group: str
        offset: int
        id: str
        key: bytes | None
        value: bytes
        headers: dict[str, bytes]
        timestamp_ms: int
        attempt: int
        lease_expires_ms: int
        _settle: Settle
    else:
        stream = property(itemgetter(_STREAM))
        group = property(itemgetter(_GROUP))
        offset = property(itemgetter(_OFFSET))
        id = property(itemgetter(_ID))
        key = property(itemgetter(_KEY))
        value = property(itemgetter(_VALUE))
        headers = property(itemgetter(_HEADERS))
        timestamp_ms = property(itemgetter(_TIMESTAMP))
        attempt = property(itemgetter(_ATTEMPT))
        lease_expires_ms = property(itemgetter(_EXPIRES))
        _settle = property(itemgetter(_SETTLE))

    def __new__(cls, stream: str, group: str, offset: int, id: str, key: bytes | None,
                value: bytes, headers: dict[str, bytes], timestamp_ms: int, attempt: int,
                lease_expires_ms: int, _settle: Settle, settled: str = "") -> Lease:
        return tuple.__new__(cls, (stream, group, offset, id, key, value, headers,
                                   timestamp_ms, attempt, lease_expires_ms, _settle, [settled],
                                   0))

    @classmethod
    def from_pb(cls, stream: str, group: str, d: pb.Delivery, settle: Settle) -> Lease:
        return cls(stream, group, d.offset, d.id, d.key if d.HasField("key") else None,
                   d.value, dict(d.headers) if d.headers else {}, d.timestamp_ms, d.attempt,
                   d.lease_expires_ms, settle)

    @classmethod
    def from_table(cls, stream: str, group: str, table: pa.Table | pa.RecordBatch,
                   settle: Settle) -> list[Lease]:
        """The leases of a DELIVERY_SCHEMA table (Arrow deliveries), one column at a time."""
        return list(cls.iter_table(stream, group, table, settle))

    @classmethod
    def iter_table(cls, stream: str, group: str, table: pa.Table | pa.RecordBatch,
                   settle: Settle) -> Iterator[Lease]:
        """``from_table``, lazily: each lease is made when it is taken.

        Per message this is only C: the columns become lists (integers and
        timestamps through numpy), and ``tuple.__new__`` makes each lease as
        the iterator is advanced.
        """
        n = table.num_rows
        if not n:
            return iter(())
        header_column = table.column("headers")
        if header_column.null_count == n:  # the usual case: no headers at all
            header_dicts: list[dict[str, bytes]] = [{} for _ in range(n)]
        else:
            header_dicts = [dict(h) if h else {} for h in header_column.to_pylist()]
        return map(tuple.__new__, repeat(cls), zip(
            repeat(stream, n), repeat(group, n), _ints(table.column("offset")),
            table.column("id").to_pylist(), table.column("key").to_pylist(),
            table.column("value").to_pylist(), header_dicts, _ints(table.column("timestamp")),
            _ints(table.column("attempt")), _ints(table.column("lease_expires")),
            repeat(settle, n), repeat([""] * n, n), range(n), strict=True))

    @property
    def settled(self) -> str:
        """``""`` until settled, then ``"ack"`` or ``"nack"``."""
        return self[_STATES][self[_INDEX]]

    @settled.setter
    def settled(self, how: str) -> None:
        self[_STATES][self[_INDEX]] = how

    @property
    def timestamp(self) -> dt.datetime:
        return datetime_from_ms(self[_TIMESTAMP])

    @property
    def lease_expires(self) -> dt.datetime:
        return datetime_from_ms(self[_EXPIRES])

    def text(self) -> str:
        return self[_VALUE].decode("utf-8")

    def ack(self) -> None:
        """Done: the message is not delivered again."""
        states = self[_STATES]
        index = self[_INDEX]
        if not states[index]:
            states[index] = "ack"
            self[_SETTLE](self, "ack", 0)

    def nack(self, delay: float = 0) -> None:
        """Not done: redeliver (to any member) now, or after ``delay`` seconds."""
        if not self.settled:
            try:
                delay_ms = parse_duration_ms(delay)
            except ValueError as exc:
                raise InvalidArgument(f"nack delay: {exc}") from None
            self.settled = "nack"
            self[_SETTLE](self, "nack", delay_ms)

    # A tuple's equality, hash and ordering compare contents; a lease is one delivery.
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def __lt__(self, other: object) -> bool:
        return NotImplemented

    __le__ = __gt__ = __ge__ = __lt__

    def __getnewargs__(self) -> tuple[object, ...]:
        """copy.copy / pickle: rebuild through ``__new__`` (the copy settles on its own)."""
        return (*self[:_SETTLE], self[_SETTLE], self.settled)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in zip(
            (*_FIELDS, "settled"), (*self[:_SETTLE], self.settled), strict=True))
        return f"Lease({fields})"


def _ints(column: pa.ChunkedArray | pa.Array) -> list[int]:
    """An integer or timestamp column as Python ints, read through numpy (no Arrow scalars).

    ``np.frombuffer`` over the values buffer: ``Array.to_numpy`` would import
    pandas on first use (~0.2 s in the first batch of a subscription).
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out: list[int] = []
    for chunk in chunks:
        width = chunk.type.bit_width // 8
        if chunk.null_count or width not in _INT_DTYPES:  # not in DELIVERY_SCHEMA
            out.extend(chunk.cast(pa.int64()).to_pylist())
            continue
        out.extend(np.frombuffer(chunk.buffers()[1], dtype=_INT_DTYPES[width], count=len(chunk),
                                 offset=chunk.offset * width).tolist())
    return out


_INT_DTYPES = {8: np.int64, 4: np.int32}


def unary_settler(client: Client, member_id: str) -> Settle:
    """Settle each lease with its own Ack / Nack call, as ``member_id``."""
    def settle(lease: Lease, how: str, delay_ms: int) -> None:
        if how == "ack":
            group_rpc.ack(client, lease.stream, lease.group, [lease.offset],
                          member_id=member_id)
        else:
            group_rpc.nack(client, lease.stream, lease.group, [lease.offset],
                           delay_ms=delay_ms, member_id=member_id)
    return settle


def ack_leases(client: Client, leases: Sequence[Lease]) -> int:
    """Ack many leases with one call per (stream, group); returns how many the broker counted."""
    groups: dict[tuple[str, str], list[int]] = {}
    for lease in leases:
        if not lease.settled:
            lease.settled = "ack"
            groups.setdefault((lease.stream, lease.group), []).append(lease.offset)
    acked = 0
    for (stream, group), offsets in groups.items():
        acked += group_rpc.ack(client, stream, group, offsets).acked
    return acked

"""Group cursor consumption (npayload / OKMQ model): ``client.consumer(stream, group)``.

A named group has one committed offset on the broker. ``pull`` returns the
next messages as a pyarrow Table (MESSAGE_SCHEMA) and, with auto-commit,
moves the group past them; without it nothing moves until ``commit``, and
the same messages come back on the next pull. Every consumer of the group,
in any process, shares that one position; other groups have their own.

Example::

    consumer = client.consumer("orders", "billing", start_from="earliest")
    batch = consumer.pull(limit=500, wait=5.0, auto_commit=False)
    for message in batch:          # or use batch.table (a pyarrow.Table)
        handle(message.value)
    consumer.commit()              # everything pulled so far is done
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from npstream.client import group_rpc
from npstream.client.checks import checked_offset
from npstream.errors import IndexOutOfRange, InvalidArgument, InvalidArgumentType
from npstream.proto import pb
from npstream.proto.names import validate_group_name, validate_stream_name
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.proto.units import datetime_from_ms, parse_timestamp_ms

if TYPE_CHECKING:
    from npstream.client.client import Client

__all__ = ["Consumer", "Message", "MessageTable", "SeekResult", "start_from_pb"]



def _check_names(stream: str, group: str) -> None:
    try:
        validate_stream_name(stream)
        validate_group_name(group)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def start_from_pb(value: object, what: str = "start_from") -> pb.StartFrom:
    """A position as the broker wants it.

    Accepted: "earliest", "latest", an offset (int, or a string of digits),
    a timestamp (datetime, or an ISO-8601 string), or a dict with exactly one
    of "offset" / "timestamp" (ISO-8601 string, datetime or epoch ms).
    """
    if isinstance(value, str):
        text = value.strip()
        if text in ("earliest", "latest"):
            return pb.StartFrom(**{text: True})
        if text.isdigit():
            return pb.StartFrom(offset=checked_offset(what, int(text), "StartFrom.offset"))
        try:
            return pb.StartFrom(timestamp_ms=parse_timestamp_ms(text))
        except ValueError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool):
        return pb.StartFrom(offset=checked_offset(what, value, "StartFrom.offset"))
    elif isinstance(value, dt.datetime):
        return pb.StartFrom(timestamp_ms=parse_timestamp_ms(value))
    elif isinstance(value, Mapping) and len(value) == 1:
        (kind, raw), = value.items()
        try:
            if kind == "offset" and isinstance(raw, int) and not isinstance(raw, bool):
                return pb.StartFrom(offset=checked_offset(what, raw, "StartFrom.offset"))
            if kind == "timestamp":
                return pb.StartFrom(timestamp_ms=parse_timestamp_ms(raw))
        except ValueError as exc:
            raise InvalidArgument(f"invalid {what} {value!r}: {exc}") from None
    raise InvalidArgument(
        f"invalid {what} {value!r}: use 'earliest', 'latest', an offset, "
        "{'offset': N} or {'timestamp': ISO-8601 or epoch ms}"
    )


@dataclass(frozen=True)
class Message:
    """One consumed message."""

    offset: int
    id: str
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    timestamp_ms: int  # broker append time

    @property
    def timestamp(self) -> dt.datetime:
        return datetime_from_ms(self.timestamp_ms)

    def text(self) -> str:
        """The value as UTF-8 text."""
        return self.value.decode("utf-8")

    def json(self) -> Any:
        """The value parsed as JSON (what ``publish`` does with dicts and lists)."""
        return json.loads(self.value)


class MessageTable:
    """The messages of one pull: a pyarrow Table that also iterates as ``Message`` objects.

    ``table`` is the pyarrow.Table (MESSAGE_SCHEMA, offset order). Table
    attributes (``num_rows``, ``column``, ``to_pandas``, ``to_pylist``, ...)
    work on this object directly, and ``pa.table(result)`` gives the Table
    through the Arrow C stream interface.
    """

    __slots__ = ("table",)

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def __len__(self) -> int:
        return self.table.num_rows

    def __bool__(self) -> bool:
        return self.table.num_rows > 0

    def __iter__(self) -> Iterator[Message]:
        t = self.table
        headers = [dict(h) if h else {} for h in t.column("headers").to_pylist()]
        yield from map(
            Message,
            t.column("offset").to_pylist(),
            t.column("id").to_pylist(),
            t.column("key").to_pylist(),
            t.column("value").to_pylist(),
            headers,
            t.column("timestamp").cast(pa.int64()).to_pylist(),
        )

    def __getitem__(self, index: int) -> Message:
        if not isinstance(index, int):
            raise InvalidArgumentType(
                "index MessageTable with an int; use .table for Arrow access")
        position = index if index >= 0 else len(self) + index
        if not 0 <= position < len(self):
            raise IndexOutOfRange(f"message index {index} out of range ({len(self)} messages)")
        return next(iter(MessageTable(self.table.slice(position, 1))))

    @property
    def offsets(self) -> list[int]:
        return self.table.column("offset").to_pylist()

    @property
    def last_offset(self) -> int | None:
        """Offset of the last message, None when empty."""
        return self.table.column("offset")[-1].as_py() if len(self) else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.table, name)

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        return self.table.__arrow_c_stream__(requested_schema)

    def __repr__(self) -> str:
        first = self.table.column("offset")[0].as_py() if len(self) else None
        return f"MessageTable({len(self)} messages, offsets {first}..{self.last_offset})"


@dataclass(frozen=True)
class SeekResult:
    """Where a seek put the group; clamped_* say the target lay outside the stream."""

    position: int
    clamped_to_start: bool
    clamped_to_end: bool


def _table(batches: list[bytes]) -> pa.Table:
    return pa.Table.from_batches(
        [pa.ipc.read_record_batch(pa.py_buffer(b), MESSAGE_SCHEMA) for b in batches],
        schema=MESSAGE_SCHEMA,
    )


class Consumer:
    """A handle on one cursor group of one stream; opening it creates the group if needed.

    ``created`` says whether this call created the group (at ``start_from``);
    otherwise it resumes at its committed position and ``start_from_ignored``
    is True when a start_from was given.
    """

    def __init__(self, client: Client, stream: str, group: str,
                 start_from: object = "earliest") -> None:
        _check_names(stream, group)
        self.client = client
        self.stream = stream
        self.group = group
        where = start_from_pb(start_from) if start_from is not None else None
        response = group_rpc.open_consumer(client, stream, group, where)
        self.created: bool = response.created
        self.start_from_ignored: bool = response.start_from_ignored
        self._position: int = response.position.committed_offset
        self._last_pulled: int | None = None

    @property
    def position(self) -> int:
        """The group's position as last reported by the broker (next offset to read)."""
        return self._position

    def pull(self, limit: int = 100, wait: float = 0.0, auto_commit: bool = True) -> MessageTable:
        """The next messages after the group's position, in offset order.

        ``wait`` seconds long-polls when there is nothing yet. With
        ``auto_commit`` the group moves past what is returned before this
        call returns; otherwise call ``commit`` when they are processed.
        """
        if limit < 1:
            raise InvalidArgument(f"limit={limit} must be >= 1")
        if wait < 0:
            raise InvalidArgument(f"wait={wait} must be >= 0 seconds")
        response = group_rpc.pull(self.client, self.stream, self.group, limit=limit, wait=wait,
                                  auto_commit=auto_commit)
        result = MessageTable(_table(list(response.batches)))
        self._position = response.next_offset
        if len(result):
            self._last_pulled = result.last_offset
        return result

    def commit(self, offset: int | None = None, *, next_offset: int | None = None) -> int:
        """Mark messages up to ``offset`` processed: the next pull starts at offset + 1.

        Without arguments, commits the last message returned by ``pull``.
        ``next_offset`` instead names the next offset to read. Returns the
        new position.
        """
        if offset is not None and next_offset is not None:
            raise InvalidArgument("give offset or next_offset, not both")
        if next_offset is None and offset is None:
            if self._last_pulled is None:
                raise InvalidArgument("nothing pulled yet: give the offset to commit")
            offset = self._last_pulled
        response = group_rpc.commit(self.client, self.stream, self.group, offset=offset,
                                    next_offset=next_offset)
        self._position = response.position.committed_offset
        return self._position

    def seek(self, to: object = None, *, offset: int | None = None,
             timestamp: object = None) -> SeekResult:
        """Move the group: to "earliest"/"latest", an ``offset`` or a ``timestamp``.

        Every puller of the group sees the new position on its next pull.
        Offsets outside the stream are clamped to its start or end, and the
        result says so.
        """
        given = [v for v in (to, offset, timestamp) if v is not None]
        if len(given) != 1:
            raise InvalidArgument(
                "seek needs exactly one of: 'earliest' / 'latest', offset=N, timestamp=T"
            )
        if offset is not None:
            where = start_from_pb({"offset": offset}, "offset")
        elif timestamp is not None:
            where = start_from_pb({"timestamp": timestamp}, "timestamp")
        else:
            where = start_from_pb(to, "seek target")
        response = group_rpc.seek(self.client, self.stream, self.group, where)
        self._position = response.position.committed_offset
        self._last_pulled = None
        return SeekResult(self._position, response.clamped_to_start, response.clamped_to_end)

    def describe(self) -> Any:
        """The group's GroupInfo (position, lag, ...)."""
        from npstream.groups.admin import describe_group

        return describe_group(self.client, self.stream, self.group)

    def __repr__(self) -> str:
        return (f"Consumer(stream={self.stream!r}, group={self.group!r}, "
                f"position={self._position}, created={self.created})")

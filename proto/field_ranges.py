"""The accepted range of every numeric and enum field of every request, in one table.

A request's integers come straight off the wire: any int64, and any int32 for
an enum (proto3 enums are open, so 99 parses as an unknown ``Ack``). Checked
by each servicer, some fields were missed: ``ack_wait_ms = 2**63 - 1`` became
a lease deadline past int64 (INTERNAL, the messages left leased), and an
unknown enum value was stored. Here every such field of every request message
(services' input types and the messages they contain) has one rule, and
``violation`` checks a parsed request against all of them, so the broker
refuses a value out of range with INVALID_ARGUMENT naming the field and its
range before any servicer sees it. Enum fields accept their declared values
only (read from the proto); integer fields are listed in ``RANGES``, and a
test requires an entry for every one, so a new field is decided here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from npstream.proto import pb

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "MAX_DELAY_MS",
    "MAX_SUBSCRIBE_CREDITS",
    "RANGES",
    "Range",
    "integer_fields",
    "request_types",
    "violation",
]

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1

# Lease lengths and redelivery delays (ack_wait_ms, backoff_ms, nack delays)
# become deadlines (now + the value, epoch ms, int64): a year is far beyond
# any use and keeps every deadline representable.
MAX_DELAY_MS = 365 * 24 * 3600 * 1000
# Credits one SubscribeRequest may grant, and the most a Subscribe call holds
# unused (the broker buffers at most this many deliveries' worth for it,
# bounded in bytes too: broker/groups/tuning.py LEASE_MAX_BYTES).
MAX_SUBSCRIBE_CREDITS = 100_000


@dataclass(frozen=True)
class Range:
    """Inclusive bounds of an integer field, and what its special values mean."""

    low: int
    high: int
    note: str = ""

    def describe(self) -> str:
        note = f"; {self.note}" if self.note else ""
        return f"{self.low}..{self.high}{note}"


_OFFSET = Range(0, INT64_MAX, "an offset")
_WAIT = Range(0, INT64_MAX, "0 = no wait; capped at the broker's max_fetch_wait")
_DELAY = Range(0, MAX_DELAY_MS, "milliseconds, at most a year")
_COUNT = Range(0, INT32_MAX, "0 = the default")
_SIZE = Range(0, INT64_MAX, "bytes, 0 = the default")
_CONFIG = Range(0, INT64_MAX, "0 = unlimited / off")
_TIMESTAMP = Range(0, INT64_MAX, "epoch milliseconds")
_BATCH = Range(0, INT64_MAX, "a Spark batch id")

# "Message.field" -> the accepted range, for every integer field of a request.
RANGES: dict[str, Range] = {
    "StreamConfig.max_age_ms": _CONFIG,
    "StreamConfig.max_bytes": _CONFIG,
    "StreamConfig.dedup_window_ms": _CONFIG,
    "StreamConfig.max_message_bytes": _CONFIG,
    "ListStreamsRequest.page_size": Range(0, INT32_MAX, "0 = 1000; at most 10000 are returned"),
    "DeleteMessagesRequest.before_offset": _OFFSET,
    "FetchRequest.offset": _OFFSET,
    "FetchRequest.max_messages": _COUNT,
    "FetchRequest.max_bytes": _SIZE,
    "FetchRequest.wait_ms": _WAIT,
    "FetchRequest.end_offset": Range(0, INT64_MAX, "0 = no end"),
    "OffsetForTimestampRequest.timestamp_ms": _TIMESTAMP,
    "StartFrom.offset": _OFFSET,
    "StartFrom.timestamp_ms": _TIMESTAMP,
    "PullRequest.limit": _COUNT,
    "PullRequest.wait_ms": _WAIT,
    "CommitRequest.offset": Range(-1, INT64_MAX - 1,
                                  "the last processed offset; the next read starts after it"),
    "CommitRequest.next_offset": _OFFSET,
    "ReceiveRequest.max_messages": _COUNT,
    "ReceiveRequest.wait_ms": _WAIT,
    "SharedGroupConfig.ack_wait_ms": Range(0, MAX_DELAY_MS,
                                           "0 = 30000; milliseconds, at most a year"),
    "SharedGroupConfig.max_deliver": Range(0, INT32_MAX, "0 = unlimited"),
    "SharedGroupConfig.backoff_ms": _DELAY,
    "OffsetRange.start": _OFFSET,
    "OffsetRange.end": _OFFSET,
    "AckRequest.offsets": _OFFSET,
    "NackRequest.offsets": _OFFSET,
    "NackRequest.delay_ms": _DELAY,
    "SubscribeRequest.credits": Range(0, MAX_SUBSCRIBE_CREDITS,
                                      "deliveries granted; the call holds at most "
                                      f"{MAX_SUBSCRIBE_CREDITS} unused"),
    "SubscribeRequest.ack_offsets": _OFFSET,
    "SubscribeRequest.nack_offsets": _OFFSET,
    "SubscribeRequest.nack_delay_ms": _DELAY,
    "StageRequest.batch_id": _BATCH,
    "StageRequest.inbox_inode": Range(0, UINT64_MAX, "st_ino of the inbox file"),
    "StageRequest.inbox_length": Range(0, UINT64_MAX, "bytes of the inbox file"),
    "CommitBatchRequest.batch_id": _BATCH,
    "AbortBatchRequest.batch_id": _BATCH,
    "MoveInRequest.position": Range(0, INT64_MAX, "a byte position in the file"),
}

_STRINGLIKE = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES,
               FieldDescriptor.TYPE_BOOL)


def _submessage(field: FieldDescriptor) -> Descriptor | None:
    """The message type of a message field (not a map's entries), None for other fields."""
    message = field.message_type
    if field.type != FieldDescriptor.TYPE_MESSAGE or message is None:
        return None
    return None if message.GetOptions().map_entry else message


def _is_integer(field: FieldDescriptor) -> bool:
    return field.type != FieldDescriptor.TYPE_MESSAGE and field.type not in _STRINGLIKE


def request_types() -> list[Descriptor]:
    """Every message a request can contain: services' input types and their fields' types."""
    seen: dict[str, Descriptor] = {}

    def visit(descriptor: Descriptor) -> None:
        if descriptor.full_name in seen:
            return
        seen[descriptor.full_name] = descriptor
        for field in descriptor.fields:
            message = _submessage(field)
            if message is not None:
                visit(message)

    for service in pb.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            if method.input_type is not None:
                visit(method.input_type)
    return list(seen.values())


def integer_fields() -> Iterator[tuple[Descriptor, FieldDescriptor]]:
    """(message, field) for every integer or enum field of a request message."""
    for descriptor in request_types():
        for field in descriptor.fields:
            if _is_integer(field):
                yield descriptor, field


@dataclass(frozen=True)
class _Rule:
    """How one field is checked: a range, or an enum's declared numbers."""

    range: Range | None
    enum_values: frozenset[int] = frozenset()
    enum_names: str = ""


@cache
def _descriptors() -> dict[str, Descriptor]:
    return {d.full_name: d for d in request_types()}


@cache
def _rules(full_name: str) -> dict[str, _Rule | None]:
    """Field name -> its rule (None: a message field to descend into) for a checked message.

    Only fields that are, or lead to, checked fields are listed, so a request's
    big repeated payload (PublishRequest.messages) is never walked.
    """
    descriptor = _descriptors()[full_name]
    rules: dict[str, _Rule | None] = {}
    for field in descriptor.fields:
        message = _submessage(field)
        if message is not None:
            if _checks_any(message.full_name):
                rules[field.name] = None
        elif field.enum_type is not None:
            values = field.enum_type.values
            rules[field.name] = _Rule(None, frozenset(v.number for v in values),
                                      ", ".join(f"{v.name}={v.number}" for v in values))
        elif _is_integer(field):
            rules[field.name] = _Rule(RANGES[f"{descriptor.name}.{field.name}"])
    return rules


@cache
def _checks_any(full_name: str) -> bool:
    """Whether a message of this type has an integer field, itself or in a field's message."""
    for field in _descriptors()[full_name].fields:
        message = _submessage(field)
        if message is None:
            if _is_integer(field):
                return True
        elif message.full_name != full_name and _checks_any(message.full_name):
            return True
    return False


def violation(message: Message, path: str = "") -> str | None:
    """What is out of range in ``message`` (a parsed request), None when every field is in range.

    The text names the field's path (``ReceiveRequest.config.ack_wait_ms``),
    the value and the accepted range or enum values.
    """
    descriptor = message.DESCRIPTOR
    rules = _rules(descriptor.full_name)
    if not rules:
        return None
    where = path or descriptor.name
    for field, value in message.ListFields():
        if field.name not in rules:
            continue
        rule = rules[field.name]
        for item in (value if field.is_repeated else (value,)):
            if rule is None:
                found = violation(item, f"{where}.{field.name}")
                if found is not None:
                    return found
            elif rule.range is not None:
                if not rule.range.low <= item <= rule.range.high:
                    return (f"{where}.{field.name}={item} is out of range: accepted "
                            f"{rule.range.describe()}")
            elif item not in rule.enum_values:
                kind = field.enum_type.name if field.enum_type is not None else "value"
                return (f"{where}.{field.name}={item} is not a known {kind}: accepted "
                        f"{rule.enum_names}")
    return None

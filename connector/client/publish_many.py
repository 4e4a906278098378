"""``Client.publish_many``: many streams' messages in a few PublishMany calls.

Why: one request per stream costs the broker its per-call gRPC work (most of
a one-message publish's CPU), so creating thousands of streams a second by
their first publish stalls on request count, not storage. ``PublishMany``
carries up to ``MAX_PUBLISH_MANY_ENTRIES`` streams' publishes in one request
and answers one result per entry (proto: PublishManyRequest).

Here the entries are encoded once (an entry's error, e.g. a bad name or a
value that cannot be sent, becomes that entry's result: it never fails the
others), grouped by the broker known to hold each stream (none known: the
client's own broker, which routes each entry itself), cut into requests of at
most ``REQUEST_ENTRIES`` entries and ``REQUEST_TARGET_BYTES`` bytes, and sent
on up to ``LANES`` calls at once. A stream's entries always travel in the same
lane, one request after another, so its messages keep the input order.

Entries answered NOT_OWNER are sent again to the member named (remembered
for later calls), up to MAX_REDIRECTS times each; STREAM_MOVING ones again
after the broker's retry hint until the client's ``retry_deadline``. A whole
request that fails (the broker unreachable past the retries) gives its
entries that error: ``publish_many`` raises only for its own arguments.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from npstream.client.batching import REQUEST_TARGET_BYTES
from npstream.client.checks import checked_stream
from npstream.client.models import PublishManyResult
from npstream.client.routing import MAX_REDIRECTS, Brokers
from npstream.client.values import encode_headers, encode_key, encode_value
from npstream.errors import (
    BrokerUnavailable,
    InvalidArgument,
    NotOwner,
    NpstreamError,
    StreamMoving,
    from_status,
)
from npstream.proto import pb
from npstream.proto.defaults import MAX_PUBLISH_MANY_BYTES
from npstream.proto.wire import varint

__all__ = ["LANES", "REQUEST_ENTRIES", "publish_many"]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- tuning
# Entries per request: 1,000 one-message entries are ~50 KB; past a few hundred
# the broker's per-request cost is already spread thin (docs/scaling.md).
REQUEST_ENTRIES = 1000
# Requests in flight at once per call (one per lane): the broker writes one
# request's entries while the nursery commits another's.
LANES = 4
# The shortest wait before entries refused with STREAM_MOVING are sent again.
_MOVING_MIN_WAIT_S = 0.05

_ENTRY_KEYS = frozenset({"stream", "value", "id", "key", "headers", "messages"})
_MESSAGE_KEYS = frozenset({"value", "id", "key", "headers"})
_ENTRY_TAG = b"\x0a"  # PublishManyRequest.entries: field 1, length-delimited


@dataclass
class _Entry:
    index: int
    stream: str
    wire: bytes  # the entry's PublishRequest, encoded once
    count: int  # its messages
    has_ids: bool  # every message has an id: a resend is deduplicated
    hops: int = 0  # redirects followed


def _message(fields: Mapping[str, Any], allowed: frozenset[str]) -> pb.Message:
    unknown = set(fields) - allowed
    if unknown:
        raise InvalidArgument(f"unknown key(s) {sorted(unknown)}: use {sorted(allowed)}")
    if "value" not in fields:
        raise InvalidArgument("a message needs a 'value'")
    message_id = fields.get("id")
    if message_id is not None and not isinstance(message_id, str):
        raise InvalidArgument(f"id must be str, got {type(message_id).__name__}")
    message = pb.Message(id=message_id or "", value=encode_value(fields["value"]),
                         headers=encode_headers(fields.get("headers")))
    key = encode_key(fields.get("key"))
    if key is not None:
        message.key = key
    return message


def _stream_named(item: object) -> str:
    """The stream an entry names as given (for the result of an entry that is not valid)."""
    name = (item.get("stream") if isinstance(item, Mapping)
            else item[0] if isinstance(item, tuple) and item else None)
    return name if isinstance(name, str) else ""


def _entry(index: int, item: object, ack: pb.Ack) -> _Entry:
    """Encode one entry: ``(stream, value)``, or a dict with ``stream`` and either
    ``value`` (plus optional ``id``, ``key``, ``headers``) or ``messages`` (a list
    of such message dicts). InvalidArgument when it is none of those."""
    if isinstance(item, tuple) and len(item) == 2:
        stream, messages = item[0], [_message({"value": item[1]}, _MESSAGE_KEYS)]
    elif isinstance(item, Mapping):
        stream = item.get("stream")
        if "messages" in item:
            if set(item) - {"stream", "messages"}:
                raise InvalidArgument("an entry with 'messages' takes no other message keys")
            listed = item["messages"]
            if not isinstance(listed, Sequence) or isinstance(listed, (str, bytes)):
                raise InvalidArgument("'messages' must be a list of message dicts")
            messages = [_message(m, _MESSAGE_KEYS) if isinstance(m, Mapping)
                        else _message({"value": m}, _MESSAGE_KEYS) for m in listed]
        else:
            messages = [_message({k: v for k, v in item.items() if k != "stream"},
                                 _ENTRY_KEYS - {"stream", "messages"})]
    else:
        raise InvalidArgument(
            f"entry {index} must be a (stream, value) pair or a dict with 'stream', got "
            f"{type(item).__name__}")
    name = checked_stream(stream)
    wire = pb.PublishRequest(stream=name, messages=messages, ack=ack).SerializeToString()
    if len(wire) + 16 > MAX_PUBLISH_MANY_BYTES:
        raise InvalidArgument(
            f"entry for stream '{name}' is {len(wire)} bytes, over what one PublishMany "
            f"request carries (MAX_PUBLISH_MANY_BYTES={MAX_PUBLISH_MANY_BYTES}): use "
            "publish_batch")
    return _Entry(index, name, wire, len(messages), all(m.id for m in messages))


def _requests(entries: Sequence[_Entry]) -> list[list[_Entry]]:
    """``entries`` cut into requests of at most REQUEST_ENTRIES and ~REQUEST_TARGET_BYTES."""
    requests: list[list[_Entry]] = []
    batch: list[_Entry] = []
    size = 0
    for entry in entries:
        nbytes = len(entry.wire) + 6
        if batch and (len(batch) >= REQUEST_ENTRIES or size + nbytes > REQUEST_TARGET_BYTES):
            requests.append(batch)
            batch, size = [], 0
        batch.append(entry)
        size += nbytes
    if batch:
        requests.append(batch)
    return requests


Outcome = pb.PublishResponse | NpstreamError


def _send(brokers: Brokers, owner: str, batch: list[_Entry]) -> list[tuple[_Entry, Outcome]]:
    """One PublishMany call to ``owner``: each entry with its response or error."""
    conn = brokers.connection(owner)
    raw = b"".join(_ENTRY_TAG + varint(len(e.wire)) + e.wire for e in batch)
    try:
        reply = conn.call_serialized(lambda s: s.StreamService.PublishMany, raw,
                                     pb.PublishManyResponse,
                                     idempotent=all(e.has_ids for e in batch))
    except NpstreamError as exc:
        return [(entry, exc) for entry in batch]
    if len(reply.results) != len(batch):
        mismatch = NpstreamError(f"broker {conn.address} answered {len(reply.results)} "
                                 f"result(s) to a PublishMany of {len(batch)} entries")
        return [(entry, mismatch) for entry in batch]
    outcomes: list[tuple[_Entry, Outcome]] = []
    for entry, result in zip(batch, reply.results, strict=True):
        if result.HasField("published"):
            outcomes.append((entry, result.published))
            continue
        failed = result.error
        outcomes.append((entry, from_status(_CODES.get(failed.code), failed.message,
                                            dict(failed.metadata), conn.address)))
    return outcomes


_CODES = {code.value[0]: code for code in grpc.StatusCode}  # EntryError.code: its number


def _send_all(brokers: Brokers, entries: list[_Entry]) -> list[tuple[_Entry, Outcome]]:
    """Send ``entries`` to their brokers, a stream's entries in one lane (module docstring)."""
    by_owner: dict[str, list[_Entry]] = {}
    for entry in entries:
        by_owner.setdefault(brokers.remembered(entry.stream) or "", []).append(entry)
    lanes: list[tuple[str, list[list[_Entry]]]] = []
    for owner, owned in by_owner.items():
        count = max(1, min(LANES, -(-len(owned) // REQUEST_ENTRIES)))
        split: list[list[_Entry]] = [[] for _ in range(count)]
        for entry in owned:
            split[zlib.crc32(entry.stream.encode()) % count if count > 1 else 0].append(entry)
        lanes.extend((owner, _requests(lane)) for lane in split if lane)

    def run(lane: tuple[str, list[list[_Entry]]]) -> list[tuple[_Entry, Outcome]]:
        owner, requests = lane
        return [outcome for batch in requests for outcome in _send(brokers, owner, batch)]

    if len(lanes) == 1:
        return run(lanes[0])
    with ThreadPoolExecutor(max_workers=min(len(lanes), LANES),
                            thread_name_prefix="npstream-publish-many") as pool:
        return [outcome for done in pool.map(run, lanes) for outcome in done]


def _stored(entry: _Entry, response: pb.PublishResponse) -> PublishManyResult:
    duplicates = [(d.index, d.offset) for d in response.duplicates]
    dup = dict(duplicates)
    offsets: list[int] = []
    next_offset = response.first_offset
    for i in range(entry.count):
        if i in dup:
            offsets.append(dup[i])
        else:
            offsets.append(next_offset)
            next_offset += 1
    return PublishManyResult(entry.stream, offsets, duplicates)


def publish_many(brokers: Brokers, items: Iterable[object], ack: pb.Ack,
                 retry_deadline: float) -> list[PublishManyResult]:
    """One result per item of ``items``, in order (Client.publish_many documents the shapes)."""
    results: list[PublishManyResult | None] = []
    pending: list[_Entry] = []
    for index, item in enumerate(items):
        try:
            pending.append(_entry(index, item, ack))
            results.append(None)
        except NpstreamError as exc:
            results.append(PublishManyResult(_stream_named(item), error=exc))
    deadline = time.monotonic() + retry_deadline
    while pending:
        again: list[_Entry] = []
        wait_s = 0.0
        for entry, outcome in _send_all(brokers, pending):
            if isinstance(outcome, pb.PublishResponse):
                results[entry.index] = _stored(entry, outcome)
            elif isinstance(outcome, NotOwner) and outcome.owner and entry.hops < MAX_REDIRECTS:
                entry.hops += 1
                brokers.learn(entry.stream, outcome.owner)
                again.append(entry)
            elif (isinstance(outcome, StreamMoving)
                  and time.monotonic() + outcome.retry_after < deadline):
                wait_s = max(wait_s, outcome.retry_after, _MOVING_MIN_WAIT_S)
                again.append(entry)
            else:
                if isinstance(outcome, BrokerUnavailable) and not isinstance(outcome, NotOwner):
                    brokers.forget(entry.stream)  # the next call asks the client's broker
                results[entry.index] = PublishManyResult(entry.stream, error=outcome)
        again.sort(key=lambda e: e.index)  # a stream's entries stay in input order
        if again:
            log.debug("publish_many: %d entrie(s) sent again (redirected or moving)",
                      len(again))
        if wait_s:
            time.sleep(wait_s)
        pending = again
    done = [result for result in results if result is not None]
    assert len(done) == len(results), "every entry has its result once nothing is pending"
    return done

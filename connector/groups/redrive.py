"""Dead-letter redrive: publish dead letters back to the stream they came from.

A shared group copies a message that ran out of attempts to its dead-letter
stream, with headers naming where it came from (``npstream-dlq-stream``,
``-group``, ``-offset``, ``-id``, ...; broker/groups/dead_letter.py). Once the
cause is fixed, ``client.redrive(dlq_stream)`` (CLI ``npstream groups
redrive``) republishes them — all, an offset range of the dead-letter stream,
or those whose header matches — to their origin streams, in dead-letter
order, and reports what moved.

Each redriven message keeps the original value, key and headers, plus
``npstream-redrive-count`` (1 on the first redrive, one more each time the
same message is dead-lettered and redriven again) and
``npstream-original-id``. Its id is ``<original id>~redrive<count>``: the
origin stream's dedup window still remembers the original id (the message
never left the origin stream), so publishing that id again would be dropped
as a duplicate of the original; the derived id is the same every time the
same dead letter is redriven, so re-running a redrive stores nothing twice
while the origin stream's dedup window covers the first run (reported as
duplicates). Messages of the dead-letter stream that are not dead-letter
copies (no ``npstream-dlq-stream`` header) are skipped and counted.

Runs on the client, with the ordinary read and publish calls: it needs
``read`` on the dead-letter stream and ``write`` on the origin streams.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from npstream.errors import InvalidArgument
from npstream.proto.names import validate_stream_name

if TYPE_CHECKING:
    from npstream.client.client import Client

__all__ = ["REDRIVE_COUNT_HEADER", "REDRIVE_ORIGINAL_ID_HEADER", "RedriveResult", "redrive"]

REDRIVE_COUNT_HEADER = "npstream-redrive-count"
REDRIVE_ORIGINAL_ID_HEADER = "npstream-original-id"
# The dead-letter copy's headers (broker/groups/dead_letter.py DLQ_HEADERS, the wire contract).
_DLQ_STREAM = "npstream-dlq-stream"
_DLQ_ID = "npstream-dlq-id"
_DLQ_PREFIX = "npstream-dlq-"
# Messages republished per publish_batch call.
REDRIVE_CHUNK = 1000


@dataclass
class RedriveResult:
    """What a redrive moved: per origin stream, messages stored and duplicates dropped."""

    moved: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    skipped: int = 0  # messages of the range that are no dead-letter copies
    not_matching: int = 0  # dead-letter copies the header filter left out
    scanned: tuple[int, int] = (0, 0)  # the dead-letter stream's offsets read: [start, end)

    @property
    def total_moved(self) -> int:
        return sum(self.moved.values())

    def to_dict(self) -> dict[str, Any]:
        return {"moved": self.moved, "duplicates": self.duplicates, "skipped": self.skipped,
                "not_matching": self.not_matching, "scanned": list(self.scanned)}


def _redriven(message: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(origin stream, message to publish) for one dead-letter copy; None if it is not one."""
    headers: dict[str, bytes] = dict(message["headers"] or [])
    origin = headers.get(_DLQ_STREAM)
    if not origin:
        return None
    previous = headers.get(REDRIVE_COUNT_HEADER, b"0")
    count = int(previous) + 1 if previous.isdigit() else 1
    original_id = headers.get(REDRIVE_ORIGINAL_ID_HEADER) or headers.get(_DLQ_ID, b"")
    kept = {k: v for k, v in headers.items()
            if not k.startswith(_DLQ_PREFIX) and k != REDRIVE_COUNT_HEADER}
    kept[REDRIVE_COUNT_HEADER] = str(count).encode()
    kept[REDRIVE_ORIGINAL_ID_HEADER] = original_id
    out: dict[str, Any] = {"value": message["value"], "headers": kept,
                           "id": f"{original_id.decode()}~redrive{count}"}
    if message["key"] is not None:
        out["key"] = message["key"]
    return origin.decode(), out


def redrive(client: Client, dlq_stream: str, *, start: int | None = None,
            end: int | None = None, header: tuple[str, str] | None = None) -> RedriveResult:
    """Republish the dead letters of ``dlq_stream`` in ``[start, end)`` to their origins.

    ``start``/``end`` default to the stream's start and end offsets;
    ``header`` = (name, value) keeps only copies carrying that header value.
    """
    try:
        validate_stream_name(dlq_stream)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    info = client.stream_info(dlq_stream)
    lo = info.start_offset if start is None else max(start, info.start_offset)
    hi = info.end_offset if end is None else min(end, info.end_offset)
    if lo > hi:
        raise InvalidArgument(f"redrive range [{start}, {end}) of '{dlq_stream}' is empty or "
                              f"reversed (the stream holds [{info.start_offset}, "
                              f"{info.end_offset}))")
    result = RedriveResult(scanned=(lo, hi))
    pending: dict[str, list[dict[str, Any]]] = {}

    def flush(origin: str) -> None:
        messages = pending.pop(origin, [])
        if not messages:
            return
        published = client.publish_batch(origin, messages)
        dropped = len(published.duplicates)
        result.moved[origin] = result.moved.get(origin, 0) + len(messages) - dropped
        result.duplicates[origin] = result.duplicates.get(origin, 0) + dropped

    wanted = (header[0], header[1].encode()) if header is not None else None
    for batch in client.read_range(dlq_stream, lo, hi):
        for message in pa.Table.from_batches([batch]).select(
                ["key", "value", "headers"]).to_pylist():
            redriven = _redriven(message)
            if redriven is None:
                result.skipped += 1
                continue
            if wanted is not None and dict(message["headers"] or []).get(wanted[0]) != wanted[1]:
                result.not_matching += 1
                continue
            origin, out = redriven
            pending.setdefault(origin, []).append(out)
            if len(pending[origin]) >= REDRIVE_CHUNK:
                flush(origin)
    for origin in list(pending):
        flush(origin)
    return result

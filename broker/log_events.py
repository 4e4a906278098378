"""The structured fields of the log lines that report events (stream, group, offsets).

An event that matters (a stream created, deleted or trimmed by retention, a
group created, moved or deleted, a sink batch committed) is logged once, as
one line whose text names the stream, the group and the offsets. Such a call
also passes ``extra=event_fields(stream=..., end_offset=...)`` so that the
JSON log format (npstream.broker.server.logs) carries them as fields a log
shipper can filter on. A leaf module: storage, streams, groups and sink all
use it, and it imports nothing of theirs.
"""

from __future__ import annotations

__all__ = ["EVENT_FIELDS", "event_fields"]

# The structured fields an event may carry (LogRecord attributes set by ``extra``).
EVENT_FIELDS = ("stream", "group", "offset", "start_offset", "end_offset", "count",
                "sink_id", "batch_id", "dead_letter_stream", "member")


def event_fields(**values: object) -> dict[str, object]:
    """``extra=`` for a logging call: the given event fields, None values left out.

    Unknown names are refused so that a typo does not silently drop a field
    from every JSON line.
    """
    unknown = sorted(set(values) - set(EVENT_FIELDS))
    if unknown:
        raise ValueError(f"unknown log event field(s) {unknown}; known: {EVENT_FIELDS}")
    return {name: value for name, value in values.items() if value is not None}

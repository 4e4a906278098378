"""The broker's log output: plain text lines, or one JSON object per line for log shippers.

Events that matter (a stream created, deleted or trimmed, a group created,
moved or deleted, a sink batch committed) are logged once each, as one line
that names the stream, the group and the offsets in its text. Such calls also
pass those values as ``extra=event_fields(...)`` so that the JSON format
carries them as fields (``"stream": "orders", "end_offset": 120``) and a log
shipper can filter on them without parsing the message. The text format
ignores the extras: the message already says it all.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from npstream.broker.log_events import EVENT_FIELDS

__all__ = ["JsonFormatter", "configure_logging"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601 with ms), level, logger, message.

    Plus every event field the record carries, the thread name, and the
    formatted traceback as ``exception`` when there is one. Never raises:
    a value JSON cannot hold is written as its ``repr``.
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in EVENT_FIELDS:
            if name in record.__dict__:
                out[name] = record.__dict__[name]
        out["thread"] = record.threadName
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, default=repr, ensure_ascii=False)


def configure_logging(level: str, log_format: str) -> None:
    """Root logging on stderr in the configured format (``text`` or ``json``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json"
                         else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)

"""The CLI's words for what the broker and the SDK say: one table, applied to every error line.

The broker and the SDK name what a program passes (``exist_ok``,
``update_stream``, gRPC metadata, ``max_message_bytes=``); a shell user has
flags and commands instead (``--exist-ok``, ``streams update``, ``--token``).
Their messages stay as they are for programs; ``translate`` rewrites the
phrases here into the CLI's own flags and commands just before
``npstream: error: ...`` is printed. A phrase the table does not know passes
through unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["translate"]

# StreamConfig fields as the broker prints them -> the CLI flag and the unit it takes.
_CONFIG_FLAGS = {"max_age_ms": ("--max-age", "ms"), "max_bytes": ("--max-bytes", ""),
                 "dedup_window_ms": ("--dedup-window", "ms"),
                 "max_message_bytes": ("--max-message-bytes", "")}


def _config_flags(match: re.Match[str]) -> str:
    """``StreamConfig(max_age_ms=1, ...)`` as the flags that give it: ``(--max-age 1ms ...)``."""
    parts = []
    for item in match.group(1).split(", "):
        name, _, value = item.partition("=")
        flag, unit = _CONFIG_FLAGS.get(name, (name, ""))
        parts.append(f"{flag} {value}{unit}")
    return f"({' '.join(parts)})"


# (what the broker or the SDK says, what the CLI says): regular expressions, applied in order.
_TABLE: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = tuple(
    (re.compile(pattern), replacement) for pattern, replacement in (
        # Access control (broker).
        (r"send metadata 'authorization: Bearer <token>'",
         "give one with --token TOKEN or $NPSTREAM_TOKEN"),
        # streams create / update (broker).
        (r"pass exist_ok to keep the existing one", "add --exist-ok to keep the existing one"),
        (r"or update_stream to evolve the schema",
         "or evolve the schema with `npstream streams update <STREAM> --schema SCHEMA`"),
        (r"delete its messages first \(delete_messages\)",
         "delete its messages first (`npstream streams truncate <STREAM> --all`)"),
        (r"StreamConfig\(([^)]*)\)", _config_flags),
        (r"^schema is empty: .*",
         "--schema is empty: give DDL ('a INT, b STRING') or Spark's StructType JSON (leave "
         "--schema out for an untyped stream)"),
        (r"\(\[cluster\] etcd\)",
         "(`npstream broker --etcd`, or [cluster] etcd in its config)"),
        (r"over the stream's max_message_bytes=(\d+)",
         r"over the stream's --max-message-bytes \1 (`npstream streams update <STREAM> "
         r"--max-message-bytes SIZE` raises it)"),
        (r"\bmax_message_bytes=(\d+) for stream", r"--max-message-bytes \1 for stream"),
        # Offsets (broker): consume --from, groups ack/nack.
        (r"start_offset=(\d+), end_offset=(\d+)", r"it holds offsets [\1, \2)"),
        # Group kinds (broker).
        (r"\(pull/commit\); receive/subscribe/ack/nack needs a shared group",
         "(`npstream consume --group`); `npstream groups receive/ack/nack` need a shared group"),
        (r"\(receive/subscribe/ack/nack\); pull/commit needs a cursor group",
         "(`npstream groups receive/ack/nack`); `npstream consume --group` needs a cursor group"),
        (r"use another group name or delete this one$",
         "use another group name or delete this one (`npstream groups delete <STREAM> <GROUP>`)"),
        (r"\(max_deliver > 0\)", "(the group's max deliver is set: --max-deliver)"),
        # Shared-group settings (SDK and broker): groups receive.
        (r"^receive on stream ('[^']*'): max_messages=(\d+)", r"receive on stream \1: --max \2"),
        (r"\b\w+Request\.config\.ack_wait_ms=(\d+)", r"--ack-wait \1ms"),
        (r"\b\w+Request\.config\.max_deliver=(\d+)", r"--max-deliver \1"),
        (r"\bReceiveRequest\.wait_ms=(\d+)", r"--wait \1ms"),
        (r"\b(?:NackRequest\.)?delay_ms=(\d+)", r"--delay \1ms"),
        (r"^ack_wait=", "--ack-wait "),
        (r"^max_deliver=", "--max-deliver "),
        # The connection (SDK).
        (r"^invalid broker address ('[^']*')",
         r"invalid --broker address \1 (or $NPSTREAM_BROKER)"),
        (r"^empty broker address", "empty --broker address (or $NPSTREAM_BROKER)"),
        (r"^timeout must be", "--timeout must be"),
        (r"^retry_deadline must be", "--retry-deadline must be"),
        (r"(gave up after \d+ attempt\(s\) over [\d.]+s)", r"\1 of --retry-deadline"),
        (r"give every message an id to make retries safe",
         "give every line an id with --id-field (and the stream a --dedup-window) to make "
         "sending it again safe"),
        # Dead-letter redrive (SDK).
        (r"^redrive range ", "redrive range (--from/--to) "),
    )
)


# The stream and group a message is about, for the commands it suggests.
_NAMED = {"<STREAM>": re.compile(r"stream '([^']+)'"), "<GROUP>": re.compile(r"group '([^']+)'")}


def translate(message: str) -> str:
    """``message`` with the SDK's and the broker's words replaced by the CLI's."""
    for pattern, replacement in _TABLE:
        message = pattern.sub(replacement, message)
    for placeholder, named in _NAMED.items():
        if placeholder in message:
            found = named.search(message)
            message = message.replace(placeholder, found.group(1) if found else
                                      placeholder.strip("<>"))
    return message

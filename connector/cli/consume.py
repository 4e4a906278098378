"""``npstream consume STREAM --from ...``: messages as JSON lines on stdout."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import pyarrow as pa

from npstream.cli.common import (
    CliError,
    add_client_options,
    client_from_args,
    group_arg,
    stream_arg,
)
from npstream.client.client import Client
from npstream.client.values import decode_text, decode_value, ms_to_iso
from npstream.errors import InvalidArgument
from npstream.proto.defaults import DEFAULT_FETCH_MESSAGES
from npstream.proto.units import parse_timestamp_ms

__all__ = ["format_messages", "register", "resolve_start"]

# ---------------------------------------------------------------- tuning
# Long-poll length of one fetch in --follow mode; a publish wakes it at once.
FOLLOW_WAIT_S = 5.0
# Messages per fetch: the broker's default.
FETCH_MESSAGES = DEFAULT_FETCH_MESSAGES


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: use an integer >= 0")
    return int(text)


def register(subparsers: Any) -> None:
    consume = subparsers.add_parser(
        "consume",
        help="print messages as JSON lines",
        description="Print one JSON object per message: offset, id, key, value (parsed JSON "
        "when the bytes are JSON, else UTF-8 text, else base64), timestamp (ISO-8601 UTC), "
        "headers. Without --follow it stops at the end offset seen at start.",
    )
    consume.add_argument("stream", type=stream_arg)
    consume.add_argument("--from", dest="start", default="earliest", metavar="POSITION",
                         help="earliest (default), latest, an offset, or an ISO-8601 time "
                              "(e.g. 2025-01-01T00:00:00Z)")
    consume.add_argument("--follow", "-f", action="store_true",
                         help="keep waiting for new messages (Ctrl-C to stop)")
    consume.add_argument("--max", type=_count, default=None, metavar="N",
                         help="stop after N messages (default: no limit)")
    consume.add_argument("--group", type=group_arg, default=None, metavar="GROUP",
                         help="read through consumer group GROUP (its position advances); "
                              "see `npstream groups`")
    add_client_options(consume)
    consume.set_defaults(handler=run)


def format_messages(batch: pa.RecordBatch | pa.Table) -> list[str]:
    """One JSON line per message of a MESSAGE_SCHEMA batch (the consume output format)."""
    offsets = batch.column("offset").to_pylist()
    ids = batch.column("id").to_pylist()
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    stamps = batch.column("timestamp").cast(pa.int64()).to_pylist()
    headers = batch.column("headers").to_pylist()
    return [
        json.dumps(
            {
                "offset": offset,
                "id": message_id,
                "key": decode_text(key),
                "value": decode_value(value),
                "timestamp": ms_to_iso(stamp),
                "headers": {name: decode_text(data) for name, data in (header or [])},
            },
            ensure_ascii=False,
        )
        for offset, message_id, key, value, stamp, header in zip(
            offsets, ids, keys, values, stamps, headers, strict=True
        )
    ]


def resolve_start(client: Client, stream: str, position: str) -> int:
    """Offset for --from: earliest, latest, an offset, or a time (first message at/after it)."""
    text = position.strip()
    if text == "earliest":
        return client.stream_info(stream).start_offset
    if text == "latest":
        return client.stream_info(stream).end_offset
    if text.isdigit():
        return int(text)
    try:
        parse_timestamp_ms(text)
    except ValueError:
        raise CliError(
            f"invalid --from {position!r}: use earliest, latest, an offset >= 0 or an "
            "ISO-8601 time such as 2025-01-01T00:00:00Z", 2
        ) from None
    try:
        return client.offset_for_timestamp(stream, text)
    except InvalidArgument as exc:
        raise CliError(f"invalid --from {position!r}: {exc}", 2) from None


def run(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        if args.group:
            from npstream.cli.groups import consume_with_group

            return consume_with_group(client, args)
        offset = resolve_start(client, args.stream, args.start)
        stop = None if args.follow else client.stream_info(args.stream).end_offset
        remaining = args.max
        out = sys.stdout
        while remaining is None or remaining > 0:
            if stop is not None and offset >= stop:
                break
            limit = FETCH_MESSAGES if remaining is None else min(remaining, FETCH_MESSAGES)
            batches, offset = client.fetch_batches(
                args.stream, offset, end_offset=stop, max_messages=limit,
                wait=FOLLOW_WAIT_S if args.follow else 0.0,
            )
            for batch in batches:
                lines = format_messages(batch)
                if remaining is not None:
                    lines = lines[:remaining]
                    remaining -= len(lines)
                if lines:
                    out.write("\n".join(lines) + "\n")
            out.flush()
    return 0

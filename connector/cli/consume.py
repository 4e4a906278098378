"""``npstream consume STREAM --from ...``: messages as JSON lines on stdout."""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import math
import sys
from typing import Any

import pyarrow as pa

from npstream.cli.common import (
    POSITION_FORMS,
    CliError,
    add_client_options,
    client_from_args,
    count_arg,
    group_arg,
    parse_offset,
    stream_arg,
)
from npstream.client.client import Client
from npstream.client.values import decode_text, decode_value, ms_to_iso
from npstream.errors import InvalidArgument
from npstream.proto.defaults import DEFAULT_FETCH_MESSAGES
from npstream.proto.units import parse_timestamp_ms

__all__ = ["format_messages", "register", "resolve_start", "typed_value_json"]

# ---------------------------------------------------------------- tuning
# Long-poll length of one fetch in --follow mode; a publish wakes it at once.
FOLLOW_WAIT_S = 5.0
# Messages per fetch: the broker's default.
FETCH_MESSAGES = DEFAULT_FETCH_MESSAGES


def register(subparsers: Any) -> None:
    consume = subparsers.add_parser(
        "consume",
        help="print messages as JSON lines",
        description="Print one JSON object per message: offset, id, key, value (parsed JSON "
        "when the bytes are JSON, else UTF-8 text, else base64; a typed stream's value is the "
        "JSON object of its fields), timestamp (ISO-8601 UTC), headers. Without --follow it "
        "stops at the end offset seen at start.",
    )
    consume.add_argument("stream", type=stream_arg)
    consume.add_argument("--from", dest="start", default="earliest", metavar="POSITION",
                         help="earliest (default), latest, an offset, or an ISO-8601 time "
                              "(e.g. 2025-01-01T00:00:00Z)")
    consume.add_argument("--follow", "-f", action="store_true",
                         help="keep waiting for new messages (Ctrl-C to stop)")
    consume.add_argument("--max", type=count_arg, default=None, metavar="N",
                         help="stop after N messages (default: no limit)")
    consume.add_argument("--group", type=group_arg, default=None, metavar="GROUP",
                         help="read through consumer group GROUP (its position advances); "
                              "see `npstream groups`")
    add_client_options(consume)
    consume.set_defaults(handler=run)


def format_messages(batch: pa.RecordBatch | pa.Table) -> list[str]:
    """One JSON line per message of a fetched batch (the consume output format).

    An untyped stream's value is shown by ``decode_value`` (JSON, text or
    base64); a typed stream's value (a struct column) as the JSON object of
    its fields (``typed_value_json``). Shared-group deliveries (``groups
    receive``) add ``attempt`` and ``lease_expires``.
    """
    value_type = batch.schema.field("value").type
    typed = pa.types.is_struct(value_type)
    offsets = batch.column("offset").to_pylist()
    ids = batch.column("id").to_pylist()
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    stamps = batch.column("timestamp").cast(pa.int64()).to_pylist()
    headers = batch.column("headers").to_pylist()
    lease = _lease_fields(batch)
    lines = []
    for offset, message_id, key, value, stamp, header, leased in zip(
        offsets, ids, keys, values, stamps, headers, lease, strict=True
    ):
        shown_value = (typed_value_json(value, value_type) if typed
                       else _dumps(decode_value(value)))
        shown_headers = {name: decode_text(data) for name, data in (header or [])}
        # The same text json.dumps gives for the whole dict, with the typed value
        # spliced in exactly (decimals keep every digit).
        lines.append(
            f'{{"offset": {_dumps(offset)}, "id": {_dumps(message_id)}, '
            f'"key": {_dumps(decode_text(key))}, "value": {shown_value}, '
            f'"timestamp": {_dumps(ms_to_iso(stamp))}, "headers": {_dumps(shown_headers)}'
            f'{leased}}}'
        )
    return lines


def _lease_fields(batch: pa.RecordBatch | pa.Table) -> list[str]:
    """A shared group's deliveries (DELIVERY_SCHEMA) also show ``attempt`` and
    ``lease_expires``; plain messages nothing more."""
    if "attempt" not in batch.schema.names:
        return [""] * batch.num_rows
    attempts = batch.column("attempt").to_pylist()
    expiries = batch.column("lease_expires").cast(pa.int64()).to_pylist()
    return [f', "attempt": {attempt}, "lease_expires": {_dumps(ms_to_iso(expires))}'
            for attempt, expires in zip(attempts, expiries, strict=True)]


def _dumps(data: object) -> str:
    return json.dumps(data, ensure_ascii=False)


def _iso_timestamp(moment: dt.datetime) -> str:
    """ISO-8601 UTC with a Z: milliseconds, or microseconds when they are not whole ms."""
    text = moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    micros = moment.microsecond
    return f"{text}.{micros // 1000:03d}Z" if micros % 1000 == 0 else f"{text}.{micros:06d}Z"


def _map_key(key: object, key_type: pa.DataType) -> str:
    """A map key as a JSON object key: its text (numbers as digits, dates ISO)."""
    text = typed_value_json(key, key_type)
    return text if text.startswith('"') else _dumps(text)


def typed_value_json(value: object, arrow_type: pa.DataType) -> str:
    """JSON text of one value of ``arrow_type`` (as ``to_pylist`` gives it).

    Objects for structs (fields in schema order) and maps (keys as text),
    arrays for lists, exact numbers for decimals, ISO-8601 text for dates and
    timestamps (UTC, ``Z``), binary as UTF-8 text else base64 (as keys and
    headers), ``"NaN"``/``"Infinity"`` for non-finite floats. What it prints
    reads back through ``npstream produce`` (``value_struct``) as the same
    value, binary that is not UTF-8 aside.
    """
    if value is None:
        return "null"
    if pa.types.is_struct(arrow_type):
        assert isinstance(value, dict)
        fields = [arrow_type.field(i) for i in range(arrow_type.num_fields)]
        return "{" + ", ".join(
            f"{_dumps(f.name)}: {typed_value_json(value.get(f.name), f.type)}" for f in fields
        ) + "}"
    if pa.types.is_map(arrow_type):
        assert isinstance(value, list)
        return "{" + ", ".join(
            f"{_map_key(k, arrow_type.key_type)}: {typed_value_json(v, arrow_type.item_type)}"
            for k, v in value
        ) + "}"
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        assert isinstance(value, list)
        return "[" + ", ".join(typed_value_json(item, arrow_type.value_type)
                               for item in value) + "]"
    if isinstance(value, decimal.Decimal):
        return str(value) if value.is_finite() else _dumps(str(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            return _dumps("NaN" if math.isnan(value) else
                          ("Infinity" if value > 0 else "-Infinity"))
        if pa.types.is_float32(arrow_type):
            import numpy as np  # the shortest text that reads back as the same float32

            return str(np.float32(value))
        return _dumps(value)
    if isinstance(value, dt.datetime):
        return _dumps(_iso_timestamp(value))
    if isinstance(value, dt.date):
        return _dumps(value.isoformat())
    if isinstance(value, bytes):
        return _dumps(decode_text(value))
    return _dumps(value)


def resolve_start(client: Client, stream: str, position: str) -> int:
    """Offset for --from: earliest, latest, an offset, or a time (first message at/after it)."""
    text = position.strip()
    if text == "earliest":
        return client.stream_info(stream).start_offset
    if text == "latest":
        return client.stream_info(stream).end_offset
    try:
        if text.isdigit():
            return parse_offset(text)
        parse_timestamp_ms(text)
    except ValueError:
        raise CliError(f"invalid --from {position!r}: {POSITION_FORMS}", 2) from None
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
        if stop is not None and offset > stop:
            # Past the end: the broker's out-of-range error (exit 1), as with --follow,
            # rather than an empty run that looks like a caught-up one.
            client.fetch_batches(args.stream, offset, max_messages=1)
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

"""``npstream groups list|describe|seek|delete|redrive`` and ``npstream consume STREAM --group G``.

(``groups receive|ack|nack``, for shared groups, are in cli/shared.py.)

``consume --group`` reads through a cursor group: it starts where the group
is (``--from`` only applies when the group is new), prints the messages as
JSON lines like plain ``consume``, and commits each batch after it is
printed and flushed, so an interrupted run repeats at most one batch.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from npstream.cli import shared as cli_shared
from npstream.cli.common import (
    POSITION_FORMS,
    CliError,
    add_client_options,
    client_from_args,
    group_arg,
    offset_arg,
    parse_offset,
    stream_arg,
)
from npstream.client import group_rpc
from npstream.client.values import ms_to_iso
from npstream.errors import InvalidArgument
from npstream.groups.admin import GroupInfo
from npstream.proto import pb

__all__ = ["consume_with_group", "register"]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- tuning
# Long-poll length of one pull in --follow mode; a publish wakes it at once.
FOLLOW_WAIT_S = 5.0
# Messages per pull.
PULL_LIMIT = 1000


def register(subparsers: Any) -> None:
    """Add `groups list|describe|seek|delete|redrive|receive|ack|nack` to the CLI."""
    groups = subparsers.add_parser(
        "groups", help="consumer groups: list, describe, seek, delete, redrive, receive, ack, "
                       "nack",
        description="Inspect and manage consumer groups. Cursor groups are read with "
        "`npstream consume STREAM --group G`; shared groups with `npstream groups receive` "
        "and settled with `groups ack` / `groups nack` (or the SDK's receive/subscribe).",
    )
    commands = groups.add_subparsers(dest="groups_command", metavar="COMMAND", required=True)

    listing = commands.add_parser("list", help="the groups of a stream, with position and lag")
    listing.add_argument("stream", type=stream_arg)
    listing.add_argument("--json", action="store_true", help="print a JSON array")
    add_client_options(listing)
    listing.set_defaults(handler=_list)

    describe = commands.add_parser("describe", help="one group: position, lag, members, "
                                   "in-flight and dead-lettered counts, settings")
    describe.add_argument("stream", type=stream_arg)
    describe.add_argument("group", type=group_arg)
    describe.add_argument("--json", action="store_true", help="print JSON")
    add_client_options(describe)
    describe.set_defaults(handler=_describe)

    seek = commands.add_parser(
        "seek", help="move a group (created if absent); its consumers see it on their next read")
    seek.add_argument("stream", type=stream_arg)
    seek.add_argument("group", type=group_arg)
    seek.add_argument("--to", required=True, metavar="POSITION",
                      help="earliest, latest, an offset, or an ISO-8601 time "
                           "(e.g. 2025-01-01T00:00:00Z: the first message at or after it)")
    add_client_options(seek)
    seek.set_defaults(handler=_seek)

    delete = commands.add_parser("delete", help="delete a group (position, settings, leases)")
    delete.add_argument("stream", type=stream_arg)
    delete.add_argument("group", type=group_arg)
    add_client_options(delete)
    delete.set_defaults(handler=_delete)

    redrive = commands.add_parser(
        "redrive", help="publish dead letters back to their origin streams",
        description="Republish the dead-letter copies of DLQ_STREAM (all, an offset range, or "
        "those with a header value) to the streams they came from, with the original value, "
        "key and headers plus npstream-redrive-count. Running it again stores nothing twice "
        "while the origin stream's dedup window covers the first run.")
    redrive.add_argument("dlq_stream", type=stream_arg, metavar="DLQ_STREAM")
    redrive.add_argument("--from", dest="start", type=offset_arg, metavar="OFFSET",
                         help="first offset of DLQ_STREAM (default: its start)")
    redrive.add_argument("--to", dest="end", type=offset_arg, metavar="OFFSET",
                         help="offset after the last one (default: its end)")
    redrive.add_argument("--header", metavar="NAME=VALUE",
                         help="only copies with this header value, e.g. "
                              "npstream-dlq-group=shipping")
    redrive.add_argument("--json", action="store_true", help="print the report as JSON")
    add_client_options(redrive)
    redrive.set_defaults(handler=_redrive)

    cli_shared.register(commands)


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2))


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _list(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        groups = client.list_groups(args.stream)
    if args.json:
        _print_json([g.to_dict() for g in groups])
        return 0
    if not groups:
        print(f"stream '{args.stream}' has no groups")
        return 0
    rows = [("GROUP", "KIND", "COMMITTED", "LAG", "IN FLIGHT", "DEAD LETTERED", "MEMBERS")]
    rows += [(g.group, g.kind or "-", str(g.committed_offset), str(g.lag), str(g.in_flight),
              str(g.dead_lettered), str(len(g.members))) for g in groups]
    _table(rows)
    return 0


def _describe_lines(info: GroupInfo) -> list[str]:
    lines = [
        f"stream:            {info.stream}",
        f"group:             {info.group}",
        f"kind:              {info.kind or '- (positioned by seek, not used yet)'}",
        f"committed offset:  {info.committed_offset}",
        f"lag:               {info.lag}",
        f"in flight:         {info.in_flight}",
        f"dead lettered:     {info.dead_lettered}",
    ]
    if info.settings is not None:
        s = info.settings
        lines += [
            f"ack wait:          {s.ack_wait:g} s",
            f"max deliver:       {s.max_deliver or 'unlimited'}",
            f"backoff:           {', '.join(f'{b:g} s' for b in s.backoff) or 'none'}",
            f"dead-letter stream: {s.dead_letter_stream}",
            f"ordering:          {'by key' if s.ordering == 'key' else 'none'}",
        ]
    lines.append(f"members:           {len(info.members)}")
    for m in info.members:
        lines.append(f"  {m.member_id}  in flight {m.in_flight}, "
                     f"last seen {ms_to_iso(m.last_seen_ms)}")
    return lines


def _describe(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        info = client.describe_group(args.stream, args.group)
    if args.json:
        _print_json(info.to_dict())
    else:
        print("\n".join(_describe_lines(info)))
    return 0


def _position(value: str, option: str) -> pb.StartFrom:
    """The position a --to/--from names; CliError (a usage error) when it names none."""
    from npstream.groups.cursor import start_from_pb

    try:
        if value.strip().isdigit():
            parse_offset(value.strip())  # within the wire's int64
        return start_from_pb(value, option)
    except (InvalidArgument, ValueError):
        raise CliError(f"invalid {option} {value!r}: {POSITION_FORMS}", 2) from None


def _seek(args: argparse.Namespace) -> int:
    target = _position(args.to, "--to")
    with client_from_args(args) as client:
        response = group_rpc.seek(client, args.stream, args.group, target)
    note = ""
    if response.clamped_to_start:
        note = " (clamped to the stream's start: earlier messages are gone)"
    elif response.clamped_to_end:
        note = " (clamped to the stream's end)"
    print(f"group '{args.group}' on stream '{args.stream}' is now at offset "
          f"{response.position.committed_offset}{note}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        deleted = client.delete_group(args.stream, args.group)
    if not deleted:
        raise CliError(f"group '{args.group}' does not exist on stream '{args.stream}'")
    print(f"deleted group '{args.group}' of stream '{args.stream}'")
    return 0


def _redrive(args: argparse.Namespace) -> int:
    header = None
    if args.header is not None:
        name, sep, value = args.header.partition("=")
        if not sep or not name:
            raise CliError(f"invalid --header {args.header!r}: use NAME=VALUE", 2)
        header = (name, value)
    with client_from_args(args) as client:
        result = client.redrive(args.dlq_stream, start=args.start, end=args.end, header=header)
    if args.json:
        _print_json(result.to_dict())
        return 0
    start, end = result.scanned
    print(f"redrive of '{args.dlq_stream}' [{start}, {end}): {result.total_moved} message(s) "
          f"moved")
    for origin in sorted(set(result.moved) | set(result.duplicates)):
        print(f"  {origin}: {result.moved.get(origin, 0)} moved, "
              f"{result.duplicates.get(origin, 0)} already redriven (duplicates)")
    if result.not_matching:
        print(f"  {result.not_matching} dead letter(s) left out by --header")
    if result.skipped:
        print(f"  {result.skipped} message(s) skipped: not dead-letter copies")
    return 0


def consume_with_group(client: Any, args: argparse.Namespace) -> int:
    """Run `npstream consume STREAM --group G [--from ...] [--max N] [--follow]`."""
    from npstream.cli.consume import format_messages

    start = getattr(args, "start", "earliest") or "earliest"
    _position(start, "--from")  # the check client.consumer makes, reported as a usage error
    consumer = client.consumer(args.stream, args.group, start_from=start)
    if consumer.created:
        log.info("created group '%s' on stream '%s' at offset %d", args.group, args.stream,
                 consumer.position)
    else:
        log.info("group '%s' on stream '%s' resumes at offset %d (--from applies only to a new "
                 "group)", args.group, args.stream, consumer.position)
    remaining = args.max
    out = sys.stdout
    while remaining is None or remaining > 0:
        limit = PULL_LIMIT if remaining is None else min(remaining, PULL_LIMIT)
        batch = consumer.pull(limit=limit, wait=FOLLOW_WAIT_S if args.follow else 0.0,
                              auto_commit=False)
        if not len(batch):
            if args.follow:
                continue
            break
        lines = format_messages(batch.table)
        out.write("\n".join(lines) + "\n")
        out.flush()
        consumer.commit(batch.last_offset)
        if remaining is not None:
            remaining -= len(lines)
    return 0

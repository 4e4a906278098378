"""``npstream streams create|update|list|describe|delete|truncate|repair|move``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from npstream.cli.common import (
    EXIT_USAGE,
    CliError,
    add_client_options,
    client_from_args,
    duration_arg,
    offset_arg,
    size_arg,
    stream_arg,
)
from npstream.client.models import StreamInfo
from npstream.client.values import ms_to_iso

__all__ = ["register"]


def register(subparsers: Any) -> None:
    streams = subparsers.add_parser(
        "streams", help="streams: create, update, list, describe, delete, truncate, repair, move")
    commands = streams.add_subparsers(dest="streams_command", metavar="COMMAND", required=True)

    create = commands.add_parser("create", help="create a stream")
    create.add_argument("name", type=stream_arg)
    _add_settings(create, "default: broker's")
    create.add_argument("--exist-ok", action="store_true",
                        help="succeed, unchanged, if the stream exists with another config")
    create.add_argument("--json", action="store_true", help="print the stream as JSON")
    add_client_options(create)
    create.set_defaults(handler=_create)

    update = commands.add_parser(
        "update", help="change a stream's settings, or give it a (new version of its) schema")
    update.add_argument("name", type=stream_arg)
    _add_settings(update, "unchanged when absent")
    update.add_argument("--json", action="store_true", help="print the stream as JSON")
    add_client_options(update)
    update.set_defaults(handler=_update)

    listing = commands.add_parser("list", help="list streams")
    only = listing.add_mutually_exclusive_group()
    only.add_argument("--prefix", help="only names starting with this")
    only.add_argument("--pattern", help="only names matching this glob, e.g. 'orders-*'")
    listing.add_argument("--json", action="store_true", help="print a JSON array")
    add_client_options(listing)
    listing.set_defaults(handler=_list)

    describe = commands.add_parser("describe", help="show offsets, size, times and config")
    describe.add_argument("name", type=stream_arg)
    describe.add_argument("--json", action="store_true", help="print JSON")
    add_client_options(describe)
    describe.set_defaults(handler=_describe)

    delete = commands.add_parser("delete", help="delete a stream and all its messages")
    delete.add_argument("name", type=stream_arg)
    add_client_options(delete)
    delete.set_defaults(handler=_delete)

    truncate = commands.add_parser(
        "truncate", help="delete messages (offsets keep growing from the end)"
    )
    truncate.add_argument("name", type=stream_arg)
    which = truncate.add_mutually_exclusive_group(required=True)
    which.add_argument("--before", type=offset_arg, metavar="OFFSET",
                       help="delete every message below OFFSET (it becomes the start offset)")
    which.add_argument("--all", action="store_true", help="delete every message")
    add_client_options(truncate)
    truncate.set_defaults(handler=_truncate)

    repair = commands.add_parser(
        "repair", help="cut a corrupted log at its first bad record so it opens again"
    )
    repair.add_argument("name", type=stream_arg)
    add_client_options(repair)
    repair.set_defaults(handler=_repair)

    move = commands.add_parser(
        "move", help="move a stream, with its groups, to another broker of the cluster")
    move.add_argument("name", type=stream_arg)
    move.add_argument("--to", required=True, metavar="MEMBER",
                      help="the broker to move it to: its advertised host:port, as listed "
                           "by 'npstream cluster status' (the broker holding it cancels an "
                           "unfinished move)")
    move.add_argument("--json", action="store_true", help="print the result as JSON")
    add_client_options(move)
    move.set_defaults(handler=_move)


def _add_settings(parser: argparse.ArgumentParser, absent: str) -> None:
    """The stream settings create and update share; ``absent`` says what leaving one out does."""
    parser.add_argument("--max-age", type=duration_arg, metavar="DURATION",
                        help=f"remove messages older than this, e.g. 7d ({absent}; 0 = "
                             "keep forever)")
    parser.add_argument("--max-bytes", type=size_arg, metavar="SIZE",
                        help="remove oldest segments above this size, e.g. 1GiB "
                             f"({absent}; 0 = no limit)")
    parser.add_argument("--dedup-window", type=duration_arg, metavar="DURATION",
                        help="drop a message whose id was seen this recently, e.g. 2m "
                             f"({absent}; 0 = off)")
    parser.add_argument("--max-message-bytes", type=size_arg, metavar="SIZE",
                        help=f"largest accepted message, e.g. 1MiB ({absent})")
    parser.add_argument("--schema", metavar="SCHEMA",
                        help="value schema of a typed stream: DDL such as "
                             "'sensorId STRING, reading DOUBLE' or Spark's StructType JSON "
                             "(docs/typed-streams.md); on update, a compatible change makes a "
                             "new version")


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2))


def _describe_lines(info: StreamInfo) -> list[str]:
    c = info.config

    def when(ms: int) -> str:
        return f"{ms_to_iso(ms)} ({ms} ms)" if ms else "-"

    def limit(value: int, unit: str) -> str:
        return f"{value} {unit}" if value else "unlimited"

    lines = [
        f"stream:             {info.name}",
        f"offsets:            [{info.start_offset}, {info.end_offset})",
        f"messages:           {info.message_count}",
        f"bytes on disk:      {info.bytes_on_disk}",
        f"segments:           {info.segment_count}",
        f"first timestamp:    {when(info.first_timestamp_ms)}",
        f"last timestamp:     {when(info.last_timestamp_ms)}",
        f"created:            {when(info.created_ms)}",
        f"max age:            {limit(c.max_age_ms, 'ms')}",
        f"max bytes:          {limit(c.max_bytes, 'bytes')}",
        f"dedup window:       {limit(c.dedup_window_ms, 'ms') if c.dedup_window_ms else 'off'}",
        f"max message bytes:  {limit(c.max_message_bytes, 'bytes')}",
    ]
    if info.schema_versions:
        latest = info.schema_versions[-1]
        lines.append(f"schema:             {latest.ddl} (version {latest.version})")
        for version in info.schema_versions:
            label = f"  version {version.version}:"
            lines.append(f"{label:<19} {when(version.created_ms)}  {version.ddl}")
    else:
        lines.append("schema:             none (untyped: binary values)")
    if info.error:
        lines.append(f"error:              {info.error}")
    return lines


def _show(info: StreamInfo, as_json: bool) -> None:
    if as_json:
        _print_json(info.to_dict())
    else:
        print("\n".join(_describe_lines(info)))


# The stream settings `create` and `update` take, as flag dests = SDK argument names.
_SETTINGS = ("max_age", "max_bytes", "dedup_window", "max_message_bytes", "schema")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in _SETTINGS}


def _create(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        info = client.create_stream(args.name, exist_ok=args.exist_ok, **_settings(args))
    _show(info, args.json)
    return 0


def _update(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if all(value is None for value in settings.values()):
        raise CliError("nothing to update: give at least one of --max-age, --max-bytes, "
                       "--dedup-window, --max-message-bytes, --schema", EXIT_USAGE)
    with client_from_args(args) as client:
        info = client.update_stream(args.name, **settings)
    _show(info, args.json)
    return 0


def _list(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        streams = client.list_streams(prefix=args.prefix, pattern=args.pattern)
    if args.json:
        _print_json([info.to_dict() for info in streams])
        return 0
    rows = [("NAME", "START", "END", "MESSAGES", "BYTES", "LAST TIMESTAMP")]
    rows += [
        (
            s.name + (" (needs repair)" if s.error else ""),
            str(s.start_offset),
            str(s.end_offset),
            str(s.message_count),
            str(s.bytes_on_disk),
            ms_to_iso(s.last_timestamp_ms) if s.last_timestamp_ms else "-",
        )
        for s in streams
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip())
    return 0


def _describe(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        info = client.stream_info(args.name)
    _show(info, args.json)
    return 0


def _delete(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        deleted = client.delete_stream(args.name)
    if not deleted:
        raise CliError(f"stream '{args.name}' does not exist")
    print(f"deleted stream '{args.name}'")
    return 0


def _truncate(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        info = client.delete_messages(args.name, before_offset=None if args.all else args.before)
    print(
        f"stream '{info.name}' now holds offsets [{info.start_offset}, {info.end_offset}) "
        f"({info.message_count} messages)"
    )
    return 0


def _repair(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        result = client.repair_stream(args.name)
    if result.truncated_bytes:
        print(
            f"repaired stream '{args.name}': cut {result.truncated_bytes} bytes at "
            f"{result.detail}; offsets now [{result.stream.start_offset}, "
            f"{result.stream.end_offset})"
        )
    else:
        print(f"stream '{args.name}' needed no repair: offsets [{result.stream.start_offset}, "
              f"{result.stream.end_offset})")
    return 0


def _move(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        result = client.move_stream(args.name, args.to)
    if args.json:
        _print_json({"stream": result.stream, "source": result.source, "target": result.target,
                     "end_offset": result.end_offset, "groups": result.groups,
                     "bytes": result.bytes, "already_there": result.already_there,
                     "paused_ms": result.paused_ms,
                     "dead_letter_streams": list(result.dead_letter_streams)})
    elif result.already_there:
        print(f"stream '{args.name}' is on {result.target} already; nothing moved")
    else:
        print(f"moved stream '{args.name}' from {result.source} to {result.target}: "
              f"{result.end_offset} offsets, {result.bytes} bytes, {result.groups} group(s); "
              f"writes paused {result.paused_ms} ms")
        for name in result.dead_letter_streams:
            print(f"moved its dead-letter stream '{name}' along")
    return 0

"""``npstream groups receive|ack|nack``: a shared group tried from the shell.

``receive`` leases messages of a shared group (``client.receive_batch``)
and prints them as ``consume`` does, plus each delivery's ``attempt`` and
``lease_expires``; the leases stay open, so ``ack`` and ``nack`` can settle
them by offset afterwards (single offsets, ranges, lists), as the member
that holds them. Each command is its own process, so the default member id
is one per machine (``<host>-cli``), not the SDK's one per process: a
``nack`` then finds the lease its ``receive`` took without ``--member``.

A shared group's settings (max deliver, backoff, dead-letter stream) are the
values of its most recent receive. ``receive`` therefore sends the group's
current ones unless a flag changes them, so trying a live group from the
shell does not reset what its application set.
"""

from __future__ import annotations

import argparse
import socket
import sys
from typing import Any

import numpy as np

from npstream.cli.common import (
    add_client_options,
    client_from_args,
    count_arg,
    duration_arg,
    group_arg,
    parse_offset,
    positive_count_arg,
    seconds_arg,
    stream_arg,
)
from npstream.client import group_rpc
from npstream.client.values import ms_to_iso
from npstream.errors import GroupNotFound, StreamNotFound
from npstream.groups.admin import SharedSettings
from npstream.groups.batch import offset_ranges
from npstream.proto.field_ranges import INT64_MAX
from npstream.proto.units import parse_duration_ms

__all__ = ["cli_member_id", "register"]

def cli_member_id() -> str:
    """The CLI's member id: one per machine, so receive and a later nack agree."""
    return f"{socket.gethostname()}-cli"


def _durations(text: str) -> list[str]:
    parts = [part.strip() for part in text.split(",")]
    for part in parts:
        try:
            parse_duration_ms(part)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"invalid backoff {text!r}: {exc}") from None
    return parts


def _offsets(text: str) -> list[tuple[int, int]]:
    """``5``, ``5-9`` (both included) or a comma list of them, as ``[start, end)`` ranges."""
    ranges = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = parse_offset(first)
            high = parse_offset(last) if dash else low
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid offsets {text!r}: use OFFSET, FIRST-LAST or a comma list of them "
                f"(e.g. 5 or 3-7,9), offsets from 0 to {INT64_MAX - 1}") from None
        if high < low:
            raise argparse.ArgumentTypeError(
                f"invalid offsets {text!r}: {low}-{high} ends before it starts")
        if high == INT64_MAX:  # its range would end past the wire's int64
            raise argparse.ArgumentTypeError(f"invalid offsets {text!r}: at most {INT64_MAX - 1}")
        ranges.append((low, high + 1))
    return ranges


def _shown(ranges: list[tuple[int, int]]) -> str:
    """``[start, end)`` ranges as the offsets argument of ack/nack (``3-7,9``)."""
    return ",".join(str(a) if b == a + 1 else f"{a}-{b - 1}" for a, b in ranges)


def register(commands: Any) -> None:
    """Add ``receive``, ``ack`` and ``nack`` to the ``groups`` subcommands."""
    member_help = ("member id (default: <host>-cli, one per machine, so a later nack "
                   f"from this machine holds the lease: {cli_member_id()})")
    receive = commands.add_parser(
        "receive", help="lease messages of a shared group and print them (settle them with "
        "ack/nack)",
        description="Lease up to --max messages of shared group GROUP (created at the "
        "stream's start if new) and print one JSON line each, as `consume` does, plus "
        "attempt and lease_expires. The leases stay open until --ack-wait passes: settle "
        "them with `npstream groups ack` or `nack` (stderr says how), or pass --ack.")
    receive.add_argument("stream", type=stream_arg)
    receive.add_argument("group", type=group_arg)
    receive.add_argument("--max", type=positive_count_arg, default=10, metavar="N",
                         help="most messages to lease (default 10; the broker leases at "
                              "most 10,000 per call)")
    receive.add_argument("--wait", type=seconds_arg, default=0.0, metavar="SECONDS",
                         help="wait this long for a message when none is deliverable "
                              "(default 0)")
    receive.add_argument("--ack-wait", type=duration_arg, default="30s", metavar="DURATION",
                         help="lease length (default 30s)")
    receive.add_argument("--ack", action="store_true",
                         help="ack every printed message at once (consume and done)")
    receive.add_argument("--member", default=None, metavar="ID", help=member_help)
    receive.add_argument("--max-deliver", type=count_arg, default=None, metavar="N",
                         help="group setting: attempts before dead-lettering, 0 = unlimited "
                              "(default: the group's, else 0)")
    receive.add_argument("--backoff", type=_durations, default=None, metavar="D1,D2,...",
                         help="group setting: waits before attempt 2, 3, ... (default: the "
                              "group's, else none)")
    receive.add_argument("--dead-letter-stream", type=stream_arg, default=None,
                         metavar="STREAM", help="group setting (default: the group's, else "
                                                "STREAM.dlq)")
    receive.add_argument("--ordering", choices=["key", "none"], default=None,
                         help="group setting: key = at most one unfinished message per key "
                              "(default: the group's, else none)")
    add_client_options(receive)
    receive.set_defaults(handler=_receive)

    for name, verb in (("ack", "done: not delivered again"),
                       ("nack", "not done: delivered again, now or after --delay")):
        settle = commands.add_parser(
            name, help=f"settle leased messages of a shared group as {verb}",
            description=f"Settle messages of shared group GROUP by offset as {verb}. "
            "OFFSETS: offsets and FIRST-LAST ranges (both included), space- or "
            "comma-separated, e.g. `3-7 9`. Prints how many the broker counted: messages "
            "not in flight" + (" or leased to another member" if name == "nack" else "")
            + " are not counted.")
        settle.add_argument("stream", type=stream_arg)
        settle.add_argument("group", type=group_arg)
        settle.add_argument("offsets", type=_offsets, nargs="+", metavar="OFFSETS")
        settle.add_argument("--member", default=None, metavar="ID", help=member_help)
        if name == "nack":
            settle.add_argument("--delay", type=duration_arg, default="0", metavar="DURATION",
                                help="redeliver after this long (default 0; the group's "
                                     "backoff applies if longer)")
        add_client_options(settle)
        settle.set_defaults(handler=_settle, settle=name)


def _group_settings(client: Any, stream: str, group: str) -> SharedSettings | None:
    """The shared group's current settings; None when it is new (or not shared)."""
    try:
        info = client.describe_group(stream, group)
    except (GroupNotFound, StreamNotFound):
        return None
    return info.settings if info.kind == "shared" else None


def _receive(args: argparse.Namespace) -> int:
    member = args.member or cli_member_id()
    with client_from_args(args) as client:
        current = _group_settings(client, args.stream, args.group)
        max_deliver = args.max_deliver
        if max_deliver is None:
            max_deliver = current.max_deliver if current else 0
        backoff = args.backoff if args.backoff is not None else (
            current.backoff if current else None)
        dead_letter = args.dead_letter_stream or (
            current.dead_letter_stream if current else None) or None
        batch = client.receive_batch(
            args.stream, args.group, args.max, wait=args.wait, ack_wait=args.ack_wait,
            max_deliver=max_deliver, backoff=backoff, dead_letter_stream=dead_letter,
            ordering=args.ordering, member_id=member)
        where = f"shared group '{args.group}' of '{args.stream}'"
        if not len(batch):
            sys.stderr.write(f"received 0 messages from {where}: nothing to deliver now"
                             f"{'' if args.wait else ' (--wait SECONDS waits for one)'}\n")
            return 0
        from npstream.cli.consume import format_messages

        sys.stdout.write("\n".join(format_messages(batch.table)) + "\n")
        sys.stdout.flush()
        offsets = _shown(offset_ranges(np.sort(batch.offsets)))
        if args.ack:
            acked = batch.ack()
            sys.stderr.write(f"received and acked {acked} of {len(batch)} message(s) from "
                             f"{where} (offsets {offsets}) as member '{member}'\n")
            return 0
        until = ms_to_iso(batch.table.column("lease_expires").cast("int64")[0].as_py())
        sys.stderr.write(
            f"received {len(batch)} message(s) from {where} (offsets {offsets}) as member "
            f"'{member}', leased until {until}: settle them with `npstream groups ack "
            f"{args.stream} {args.group} {offsets} --member {member}` (or nack)\n")
    return 0


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted ``[start, end)`` ranges with overlapping and adjacent ones joined."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _settle(args: argparse.Namespace) -> int:
    member = args.member or cli_member_id()
    merged = _merged([pair for ranges in args.offsets for pair in ranges])
    named = sum(end - start for start, end in merged)
    with client_from_args(args) as client:
        if args.settle == "ack":
            counted = group_rpc.ack(client, args.stream, args.group, [], member_id=member,
                                    ranges=merged).acked
        else:
            counted = group_rpc.nack(client, args.stream, args.group, [],
                                     delay_ms=parse_duration_ms(args.delay), member_id=member,
                                     ranges=merged).nacked
    done = "acked" if args.settle == "ack" else "nacked"
    line = (f"{done} {counted} of {named} message(s) of shared group '{args.group}' "
            f"of '{args.stream}' (offsets {_shown(merged)}) as member '{member}'")
    if counted < named:
        line += (f"; {named - counted} not {done}: not in flight (already settled, "
                 "dead-lettered or never delivered)")
        if args.settle == "nack":
            line += f", or leased to another member than '{member}' (--member)"
    print(line)
    return 0

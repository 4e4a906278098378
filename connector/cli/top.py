"""``npstream top``: a live view of a broker's streams and groups, refreshed in place.

It reads the broker over gRPC, so it needs no metrics port: one
``StreamService.StreamStats`` call per refresh gives every stream's offsets,
size and traffic counters since the broker started, and one ``ListGroups``
per shown stream the groups' committed offsets, lag and in-flight leases.
Rates are the differences between two refreshes over the broker's clock:
messages in and out per second for streams, the committed offset's progress
per second for groups (how fast the group consumes). The first screen has
no rates yet ("-").

Against a cluster of brokers StreamStats answers for every member (the
member asked gathers the others' streams), so every stream of the cluster is
shown, with a BROKER column naming the member that holds each one (one
``ClusterService.Owners`` call per refresh, so a moved stream shows its new
member) and the members in the header.

Keys: ``q`` quits, ``s`` sorts by the next column (in, out, end offset,
size, name, lag), ``r`` reverses the order, ``g`` hides or shows the groups
section (the groups are still read, so the counts in the title and the
GROUPS column stay true; ``--no-groups`` does not read them at all, and then
shows no group counts). When stdout is not a terminal, or with ``--once``,
it prints one screen (after two samples, so rates are filled in), without
the keys line, and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import shutil
import sys
import termios
import time
import tty
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from npstream.cli.common import CliError, add_client_options, client_from_args, human_size
from npstream.client import connection
from npstream.client.models import StreamActivity, StreamStats
from npstream.errors import NpstreamError
from npstream.groups.admin import GroupInfo, list_groups
from npstream.proto import pb

__all__ = ["SORT_KEYS", "Screen", "register", "render"]

SORT_KEYS = ("in", "out", "end", "size", "name", "lag")
# Streams whose groups are listed per refresh (one ListGroups call each).
MAX_GROUP_STREAMS = 50
# Streams whose member is asked per refresh (one Owners call; the broker's limit).
MAX_OWNERS = 10_000

_HOME, _CLEAR_EOL, _CLEAR_EOS = "\x1b[H", "\x1b[K", "\x1b[J"
_ALT_ON, _ALT_OFF = "\x1b[?1049h\x1b[?25l", "\x1b[?25h\x1b[?1049l"


def register(subparsers: Any) -> None:
    top = subparsers.add_parser(
        "top", help="live view of streams (rates, offsets, sizes) and groups (lag, rate, "
        "in flight); q quits",
        description="A live view of the broker's streams and groups, refreshed in place. "
        "Keys: q quit, s sort by the next column, r reverse, g show/hide groups.")
    top.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                     help="refresh interval (default 2)")
    top.add_argument("--sort", choices=SORT_KEYS, default="in",
                     help="sort column (default: in, messages in per second)")
    top.add_argument("--pattern", default="*", metavar="GLOB",
                     help="only streams matching this glob (default *)")
    top.add_argument("--once", action="store_true",
                     help="print one screen (after two samples) and exit; the default when "
                          "stdout is not a terminal")
    top.add_argument("--no-groups", action="store_true", help="streams only")
    add_client_options(top)
    top.set_defaults(handler=_run)


# ------------------------------------------------------------------ model


@dataclass(frozen=True)
class StreamRow:
    name: str
    rate_in: float | None
    rate_out: float | None
    end_offset: int
    messages: int
    size: int
    groups: int
    error: str = ""
    broker: str = ""  # the cluster member holding it ("" without a cluster)


@dataclass(frozen=True)
class GroupRow:
    stream: str
    group: str
    kind: str
    lag: int
    rate: float | None
    in_flight: int
    dead_lettered: int
    members: int


@dataclass
class Sample:
    """One refresh: the streams' counters and the groups, at the broker's time."""

    stats: StreamStats
    groups: list[GroupInfo] = field(default_factory=list)
    owners: dict[str, str] = field(default_factory=dict)  # stream -> member (a cluster)
    members: list[str] = field(default_factory=list)  # the cluster's members (none: one broker)


def _rate(before: int | None, after: int, seconds: float | None) -> float | None:
    if before is None or seconds is None or seconds <= 0 or after < before:
        return None
    return (after - before) / seconds


def rows(previous: Sample | None, current: Sample) -> tuple[list[StreamRow], list[GroupRow]]:
    """The screen's rows; rates from ``previous`` (None: none yet, or the broker restarted)."""
    seconds = None
    old_streams: dict[str, StreamActivity] = {}
    old_groups: dict[tuple[str, str], int] = {}
    if previous is not None and (previous.stats.broker_start_ms
                                 == current.stats.broker_start_ms):
        seconds = (current.stats.broker_time_ms - previous.stats.broker_time_ms) / 1000
        old_streams = {a.info.name: a for a in previous.stats.streams}
        old_groups = {(g.stream, g.group): g.committed_offset for g in previous.groups}
    counts: dict[str, int] = {}
    for g in current.groups:
        counts[g.stream] = counts.get(g.stream, 0) + 1
    streams = []
    for activity in current.stats.streams:
        info, old = activity.info, old_streams.get(activity.info.name)
        streams.append(StreamRow(
            info.name,
            _rate(old.messages_in if old else None, activity.messages_in, seconds),
            _rate(old.messages_out if old else None, activity.messages_out, seconds),
            info.end_offset, info.message_count, info.bytes_on_disk,
            counts.get(info.name, 0), info.error, current.owners.get(info.name, "")))
    groups = [GroupRow(g.stream, g.group, g.kind or "-", g.lag,
                       _rate(old_groups.get((g.stream, g.group)), g.committed_offset, seconds),
                       g.in_flight, g.dead_lettered, len(g.members))
              for g in current.groups]
    return streams, groups


def take_sample(client: Any, pattern: str, with_groups: bool) -> Sample:
    stats: StreamStats = client.stream_stats(pattern=pattern)
    sample = Sample(stats)
    names = [activity.info.name for activity in stats.streams][:MAX_OWNERS]
    with contextlib.suppress(NpstreamError):  # an older broker: no owners, one broker
        reply = client.call(lambda s: s.ClusterService.Owners, pb.OwnersRequest(streams=names))
        sample.members = list(reply.members)
        if sample.members:
            sample.owners = {entry.stream: entry.owner for entry in reply.owners}
    if with_groups:
        for activity in stats.streams[:MAX_GROUP_STREAMS]:
            with contextlib.suppress(NpstreamError):  # deleted meanwhile, or not readable
                sample.groups.extend(list_groups(client, activity.info.name))
    return sample


# ------------------------------------------------------------------ rendering


def _num(value: int) -> str:
    return f"{value:,}"


def _per_s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _table(header: Sequence[str], body: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max([len(header[i]), *(len(r[i]) for r in body)]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [line(header), *(line(r) for r in body)]


# Numbers high first, names A-Z (the name breaks ties); ``r`` flips the order.
_STREAM_SORT: dict[str, Any] = {
    "in": lambda r: (-(r.rate_in or 0.0), r.name),
    "out": lambda r: (-(r.rate_out or 0.0), r.name),
    "end": lambda r: (-r.end_offset, r.name),
    "size": lambda r: (-r.size, r.name),
    "name": lambda r: r.name,
}


@dataclass
class Screen:
    """What the view shows and how: sort column and order, groups on or off."""

    address: str
    interval: float
    sort: str = "in"
    reverse: bool = False
    show_groups: bool = True  # the groups section (key g); the counts show either way
    read_groups: bool = True  # False (--no-groups): groups are not read, no counts shown
    live: bool = True  # a live screen that takes keys (else one printed screen)
    status: str = ""
    members: list[str] = field(default_factory=list)  # a cluster's members (header)


def render(screen: Screen, streams: list[StreamRow], groups: list[GroupRow],
           width: int = 200, height: int = 1000) -> list[str]:
    """The lines of one screen (plain text, at most ``height`` lines of ``width``)."""
    key = _STREAM_SORT.get(screen.sort, _STREAM_SORT["name"])  # lag: groups by lag
    ordered = sorted(streams, key=key, reverse=screen.reverse)
    arrow = "^" if screen.reverse else "v"
    cluster = (f" (cluster of {len(screen.members)}: {', '.join(screen.members)})"
               if screen.members else "")
    counts = f"{len(streams)} streams, {len(groups)} groups" if screen.read_groups else (
        f"{len(streams)} streams")
    out = [
        f"npstream top - {screen.address}{cluster} - {counts} - "
        f"every {screen.interval:g}s - sort: {screen.sort} {arrow}"
        f"{'  ' + screen.status if screen.status else ''}",
        *(["keys: q quit  s sort  r reverse  g groups"] if screen.live else []),
        "",
    ]
    header: tuple[str, ...] = ("STREAM", "IN/s", "OUT/s", "END OFFSET", "MESSAGES", "SIZE")
    body: list[tuple[str, ...]] = [
        (r.name + (" (needs repair)" if r.error else ""), _per_s(r.rate_in),
         _per_s(r.rate_out), _num(r.end_offset), _num(r.messages), human_size(r.size))
        for r in ordered]
    if screen.read_groups:
        header = (*header, "GROUPS")
        body = [(*cells, str(r.groups)) for cells, r in zip(body, ordered, strict=True)]
    if screen.members:
        header = (*header, "BROKER")
        body = [(*cells, r.broker) for cells, r in zip(body, ordered, strict=True)]
    out += _table(header, body, right={1, 2, 3, 4, 5, *([6] if screen.read_groups else [])})
    if screen.read_groups and screen.show_groups:
        if screen.sort == "lag":
            ordered_groups = sorted(groups, key=lambda g: (-g.lag, g.stream, g.group),
                                    reverse=screen.reverse)
        else:
            ordered_groups = sorted(groups, key=lambda g: (g.stream, g.group))
        out.append("")
        out += _table(("GROUP", "STREAM", "KIND", "LAG", "RATE/s", "IN FLIGHT", "DEAD",
                       "MEMBERS"),
                      [(g.group, g.stream, g.kind, _num(g.lag), _per_s(g.rate), _num(g.in_flight),
                        _num(g.dead_lettered), str(g.members)) for g in ordered_groups],
                      right={3, 4, 5, 6, 7})
    return [line[: max(width - 1, 10)] for line in out[:height]]


# ------------------------------------------------------------------ terminal


@contextlib.contextmanager
def _terminal(stdin: TextIO, stdout: TextIO) -> Iterator[None]:
    """Keys without Enter (cbreak) and the alternate screen; both undone on exit."""
    fd = stdin.fileno()
    saved = termios.tcgetattr(fd) if os.isatty(fd) else None
    if saved is not None:
        tty.setcbreak(fd)
    stdout.write(_ALT_ON)
    stdout.flush()
    try:
        yield
    finally:
        stdout.write(_ALT_OFF)
        stdout.flush()
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _keys(stdin: TextIO, timeout: float) -> str:
    """Keys typed within ``timeout`` seconds ("" when none)."""
    fd = stdin.fileno()
    ready, _, _ = select.select([fd], [], [], max(timeout, 0.0))
    if not ready:
        return ""
    data = os.read(fd, 64)
    if not data:  # stdin closed: nothing will ever be typed; keep refreshing
        time.sleep(timeout)
    return data.decode(errors="replace")


def _apply(screen: Screen, keys: str) -> bool:
    """Apply typed keys to the screen; False when q was typed."""
    for key in keys:
        if key in "qQ":
            return False
        if key == "s":
            screen.sort = SORT_KEYS[(SORT_KEYS.index(screen.sort) + 1) % len(SORT_KEYS)]
        elif key == "r":
            screen.reverse = not screen.reverse
        elif key == "g":
            screen.show_groups = not screen.show_groups
    return True


def _run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise CliError("--interval must be > 0", exit_code=2)
    client = client_from_args(args)
    screen = Screen(client.address, args.interval, sort=args.sort,
                    read_groups=not args.no_groups,
                    live=not args.once and sys.stdout.isatty())
    with client:
        if not screen.live:
            first = take_sample(client, args.pattern, screen.read_groups)
            time.sleep(args.interval)
            second = take_sample(client, args.pattern, screen.read_groups)
            screen.members = second.members
            for line in render(screen, *rows(first, second)):
                print(line)
            return 0
        return _live(client, args, screen)


@contextlib.contextmanager
def _quiet_retries() -> Iterator[None]:
    """No retry WARNING lines over the live screen: its title line shows the error."""
    logger = logging.getLogger(connection.__name__)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _live(client: Any, args: argparse.Namespace, screen: Screen) -> int:
    previous: Sample | None = None
    shown: tuple[list[StreamRow], list[GroupRow]] = ([], [])
    with _terminal(sys.stdin, sys.stdout), _quiet_retries():
        while True:
            started = time.monotonic()
            try:
                current = take_sample(client, args.pattern, screen.read_groups)
                screen.members = current.members
                shown = rows(previous, current)
                previous = current
                screen.status = ""
            except NpstreamError as exc:  # the broker restarting: keep the last screen
                screen.status = f"[{type(exc).__name__}: {' '.join(str(exc).split())[:80]}]"
            while True:
                size = shutil.get_terminal_size()
                lines = render(screen, *shown, width=size.columns, height=size.lines)
                sys.stdout.write(_HOME + "".join(f"{line}{_CLEAR_EOL}\r\n" for line in lines)
                                 + _CLEAR_EOS)
                sys.stdout.flush()
                keys = _keys(sys.stdin, screen.interval - (time.monotonic() - started))
                if not _apply(screen, keys):
                    return 0
                if not keys:  # the interval is over: take the next sample
                    break

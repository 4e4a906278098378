"""What every ``npstream`` subcommand shares: connection flags, argument types, errors.

Subcommand modules (cli/streams.py, produce.py, consume.py, groups.py) add
``add_client_options`` to their parsers and build clients with
``client_from_args`` so that ``--broker``/``--token`` and the TLS flags
(``--tls``, ``--ca-file``, ``--client-cert``/``--client-key`` for brokers
that require client certificates) behave the same everywhere.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from npstream.cli.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, CliError
from npstream.client.client import Client
from npstream.proto.defaults import BROKER_ADDRESS_ENV, DEFAULT_BROKER_ADDRESS
from npstream.proto.field_ranges import INT32_MAX, INT64_MAX, MAX_DELAY_MS
from npstream.proto.names import validate_group_name, validate_stream_name
from npstream.proto.units import parse_duration_ms, parse_size

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "POSITION_FORMS",
    "CliError",
    "CliParser",
    "add_client_options",
    "client_from_args",
    "count_arg",
    "duration_arg",
    "group_arg",
    "offset_arg",
    "parse_offset",
    "positive_count_arg",
    "seconds_arg",
    "size_arg",
    "stream_arg",
]


class CliParser(argparse.ArgumentParser):
    """argparse with usage errors on one line (``npstream: error: ...``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see `{self.prog} --help`)", EXIT_USAGE)


def add_client_options(parser: argparse.ArgumentParser) -> None:
    """--broker, --token and the TLS flags, with the environment defaults the docs promise."""
    parser.add_argument(
        "--broker",
        default=os.environ.get(BROKER_ADDRESS_ENV) or DEFAULT_BROKER_ADDRESS,
        metavar="HOST:PORT",
        help=f"broker address (default: ${BROKER_ADDRESS_ENV}, else {DEFAULT_BROKER_ADDRESS})",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("NPSTREAM_TOKEN") or None,
        help="auth token sent as 'authorization: Bearer TOKEN' (default: $NPSTREAM_TOKEN)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="connect with TLS (the system's CA certificates verify the broker unless --ca-file)",
    )
    parser.add_argument(
        "--ca-file",
        default=os.environ.get("NPSTREAM_CA_FILE") or None,
        metavar="PEM",
        help="CA certificate(s) that verify the broker; implies --tls (default: $NPSTREAM_CA_FILE)",
    )
    parser.add_argument(
        "--client-cert",
        default=os.environ.get("NPSTREAM_CLIENT_CERT") or None,
        metavar="PEM",
        help="client certificate for brokers that require one (mutual TLS); needs "
             "--client-key, implies --tls (default: $NPSTREAM_CLIENT_CERT)",
    )
    parser.add_argument(
        "--client-key",
        default=os.environ.get("NPSTREAM_CLIENT_KEY") or None,
        metavar="PEM",
        help="private key of --client-cert (default: $NPSTREAM_CLIENT_KEY)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="per-call deadline in seconds (default: 30)",
    )
    parser.add_argument(
        "--retry-deadline",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="how long to retry an unreachable broker before failing (default: 15)",
    )


def _pem(flag: str, path: str | None) -> bytes | None:
    """The bytes of a PEM file named by a flag; a usage error naming the flag otherwise."""
    if path is None:
        return None
    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise CliError(f"{flag} {path}: cannot read the file: {exc.strerror or exc}",
                       EXIT_USAGE) from None
    if b"-----BEGIN " not in data:
        raise CliError(f"{flag} {path}: the file holds no PEM data", EXIT_USAGE)
    return data


def client_from_args(args: argparse.Namespace) -> Client:
    if (args.client_cert is None) != (args.client_key is None):
        raise CliError("--client-cert and --client-key go together: give both or neither",
                       EXIT_USAGE)
    try:
        return Client(
            args.broker, args.token, tls=args.tls,
            root_certificates=_pem("--ca-file", args.ca_file),
            client_cert=_pem("--client-cert", args.client_cert),
            client_key=_pem("--client-key", args.client_key),
            timeout=args.timeout, retry_deadline=args.retry_deadline,
        )
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def _argtype(check: Callable[[str], object], what: str, *,
             keep_text: bool = False) -> Callable[[str], object]:
    """An argparse ``type=`` that reports check's ValueError as a usage error.

    keep_text returns the text itself after checking (durations and sizes are
    parsed again by the client, which keeps "7d" exact instead of a float).
    """

    def convert(text: str) -> object:
        try:
            value = check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text if keep_text else value

    convert.__name__ = what
    return convert


# What --from and --to take (consume, consume --group, groups seek).
POSITION_FORMS = (f"use earliest, latest, an offset from 0 to {INT64_MAX} or an ISO-8601 time "
                  "such as 2025-01-01T00:00:00Z")
# Longest wait a seconds flag takes (--wait, --linger): the wire's longest delay.
MAX_SECONDS = MAX_DELAY_MS // 1000


def parse_offset(text: str) -> int:
    """An offset typed on the command line: ASCII digits, at most the wire's int64."""
    if not (text.isascii() and text.isdigit()) or int(text) > INT64_MAX:
        raise ValueError(f"invalid offset {text!r}: use an integer from 0 to {INT64_MAX}")
    return int(text)


def _count(text: str, low: int = 0) -> int:
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= INT32_MAX:
        raise ValueError(f"invalid count {text!r}: use an integer from {low} to {INT32_MAX}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_SECONDS:  # also NaN and infinity
        raise ValueError(f"invalid seconds {text!r}: use a number from 0 to {MAX_SECONDS} "
                         "(a year)")
    return value


stream_arg = _argtype(validate_stream_name, "stream name")
group_arg = _argtype(validate_group_name, "group name")
duration_arg = _argtype(parse_duration_ms, "duration", keep_text=True)
size_arg = _argtype(parse_size, "size", keep_text=True)
offset_arg = _argtype(parse_offset, "offset")
count_arg = _argtype(_count, "count")
positive_count_arg = _argtype(lambda text: _count(text, 1), "count")
seconds_arg = _argtype(_seconds, "seconds")


def human_size(value: int | None) -> str:
    """Bytes as the CLI's tables show them (binary units, one decimal; "-" when unknown)."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"

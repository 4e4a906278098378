"""The ``npstream`` command: streams admin, produce, consume, groups, and the broker itself.

Every expected failure ends as one ``npstream: error: ...`` line on stderr, in
the CLI's words (cli/messages.py translates the broker's and the SDK's), and
a non-zero exit code (2 for a wrong command line, 1 for errors from the broker
or bad input data, 130 on Ctrl-C); a traceback means a bug.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from npstream import __version__
from npstream.cli import cluster as cli_cluster
from npstream.cli import consume as cli_consume
from npstream.cli import groups as cli_groups
from npstream.cli import produce as cli_produce
from npstream.cli import streams as cli_streams
from npstream.cli import top as cli_top
from npstream.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, CliError, CliParser
from npstream.cli.messages import translate
from npstream.errors import NpstreamError

__all__ = ["build_parser", "main"]


def build_parser() -> CliParser:
    parser = CliParser(
        prog="npstream",
        description="npstream: a durable, ordered event log. "
        "Run `npstream COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"npstream {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more on stderr (-v: info, -vv: debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    subparsers.add_parser(
        "broker", help="run a broker (all arguments go to `python -m npstream.broker`)",
        add_help=False,
    )
    cli_streams.register(subparsers)
    cli_produce.register(subparsers)
    cli_consume.register(subparsers)
    cli_groups.register(subparsers)
    cli_top.register(subparsers)
    cli_cluster.register(subparsers)
    return parser


def _error(message: str) -> None:
    sys.stderr.write(f"npstream: error: {translate(' '.join(message.split()))}\n")
    sys.stderr.flush()


def _run(argv: list[str]) -> int:
    if argv[:1] == ["broker"]:
        # The client side never imports the broker (layering): the broker runs
        # as its own module in this process, replacing the CLI.
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "npstream.broker", *argv[1:]])
    args = build_parser().parse_args(argv)
    # Warnings (e.g. a broker being retried) read as the CLI's own lines; -v adds
    # which module logged each line.
    logging.basicConfig(
        level={0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG),
        format=("npstream: %(levelname)s %(name)s: %(message)s" if args.verbose
                else "npstream: %(levelname)s: %(message)s"),
    )
    return int(args.handler(args))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``npstream`` script and ``python -m npstream.cli``."""
    try:
        return _run(list(sys.argv[1:] if argv is None else argv))
    except CliError as exc:
        _error(str(exc))
        return exc.exit_code
    except NpstreamError as exc:
        notes = getattr(exc, "__notes__", [])
        _error("; ".join([str(exc), *notes]))
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`npstream consume s | head`): stop quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""The CLI's error and the exit statuses it ends a command with."""

from __future__ import annotations

from npstream.errors import NpstreamError

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_USAGE", "CliError"]

EXIT_ERROR = 1        # the broker refused or failed, or input data was bad
EXIT_USAGE = 2        # the command line itself is wrong
EXIT_INTERRUPTED = 130


class CliError(NpstreamError):
    """An expected failure: printed as one ``npstream: error: ...`` line, no traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code

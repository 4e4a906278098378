"""The server package's errors: a configuration or a start the broker refuses.

Neither reaches a client: both stop the broker before it serves, with the
message on stderr (npstream.broker.server.process).
"""

from __future__ import annotations

__all__ = ["ConfigError", "StartupError"]


class ConfigError(ValueError):
    """A configuration value or file the broker refuses to start with."""


class StartupError(RuntimeError):
    """The broker cannot start (data dir in use, port taken, ...); the message says why."""

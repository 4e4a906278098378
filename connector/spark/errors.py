"""The Spark data source's errors, all NpstreamErrors (and the builtin they mean).

Raised on the driver or an executor, never by a broker call: a bad option
(``InvalidOptionError``), streams whose schemas cannot be read as one
(``ReadSchemaError``), messages a query needs that are gone with
``failOnDataLoss`` (``DataLossError``), and the streaming writer run outside
a micro-batch (``NoMicroBatchError``). Their old homes
(``npstream.spark.options.InvalidOptionError``, ...) still name them.
"""

from __future__ import annotations

from npstream.errors import NpstreamError

__all__ = ["DataLossError", "InvalidOptionError", "NoMicroBatchError", "ReadSchemaError"]


class InvalidOptionError(NpstreamError, ValueError):
    """A read or write option is unknown, malformed or conflicts with another one."""


class ReadSchemaError(NpstreamError, ValueError):
    """The streams of one read cannot share a schema, or a batch does not fit the schema."""


class DataLossError(NpstreamError, RuntimeError):
    """Messages the query needs are gone and ``failOnDataLoss`` is true."""

    def __init__(self, message: str, *, stream: str, start: int, end: int | None) -> None:
        super().__init__(message)
        self.stream = stream
        self.start = start
        self.end = end


class NoMicroBatchError(NpstreamError, RuntimeError):
    """The streaming writer ran outside a Structured Streaming micro-batch (no batch id)."""

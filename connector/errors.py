"""Client-side exceptions: one root, one class per gRPC status a caller handles.

``from_rpc_error`` is the single place where a ``grpc.RpcError`` becomes one of
these. OUT_OF_RANGE errors carry the stream's offsets as trailing metadata
(``npstream.proto.metadata_keys.OFFSET_KEYS``), so callers such as the Spark reader's data-loss
check get numbers, not text to parse.
"""

from __future__ import annotations

import grpc

from npstream.proto import metadata_keys

__all__ = [
    "AlreadyExists",
    "BrokerUnavailable",
    "GroupNotFound",
    "InvalidArgument",
    "NpstreamError",
    "OffsetOutOfRange",
    "StreamNeedsRepair",
    "StreamNotFound",
    "Unauthenticated",
    "from_rpc_error",
]


class NpstreamError(Exception):
    """Root of every error the client raises; ``code`` is the gRPC status, if any."""

    code: grpc.StatusCode | None = None

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class InvalidArgument(NpstreamError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class StreamNotFound(NpstreamError, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class GroupNotFound(NpstreamError, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(NpstreamError):
    code = grpc.StatusCode.ALREADY_EXISTS


class OffsetOutOfRange(NpstreamError, IndexError):
    """The requested offset lies outside [start_offset, end_offset] of the stream."""

    code = grpc.StatusCode.OUT_OF_RANGE

    def __init__(
        self,
        message: str,
        *,
        stream: str = "",
        offset: int = -1,
        start_offset: int = -1,
        end_offset: int = -1,
    ) -> None:
        super().__init__(message)
        self.stream = stream
        self.offset = offset
        self.start_offset = start_offset
        self.end_offset = end_offset


class StreamNeedsRepair(NpstreamError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unauthenticated(NpstreamError):
    code = grpc.StatusCode.UNAUTHENTICATED


class BrokerUnavailable(NpstreamError, ConnectionError):
    """The broker could not be reached within the deadline (after retries)."""

    code = grpc.StatusCode.UNAVAILABLE


def from_rpc_error(exc: grpc.RpcError, address: str) -> NpstreamError:
    """Translate a gRPC error into the matching NpstreamError (message kept)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    if code == grpc.StatusCode.OUT_OF_RANGE:
        meta = {k: v for k, v in (exc.trailing_metadata() or ())} if hasattr(
            exc, "trailing_metadata"
        ) else {}

        def num(key: str) -> int:
            try:
                return int(meta.get(key, -1))
            except (TypeError, ValueError):
                return -1

        return OffsetOutOfRange(
            details,
            stream=str(meta.get(metadata_keys.STREAM, "")),
            offset=num(metadata_keys.OFFSET),
            start_offset=num(metadata_keys.START_OFFSET),
            end_offset=num(metadata_keys.END_OFFSET),
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return BrokerUnavailable(f"broker at {address} is unavailable: {details}", code=code)
    by_code: dict[grpc.StatusCode, type[NpstreamError]] = {
        grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
        grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
        grpc.StatusCode.FAILED_PRECONDITION: StreamNeedsRepair,
        grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    }
    if code == grpc.StatusCode.NOT_FOUND:
        cls: type[NpstreamError] = GroupNotFound if "group" in details.split("'")[0] else (
            StreamNotFound
        )
        return cls(details)
    cls = by_code.get(code, NpstreamError)  # type: ignore[arg-type]
    return cls(details, code=code) if cls is NpstreamError else cls(details)

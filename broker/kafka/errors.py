"""Kafka's error codes that the listener answers (org.apache.kafka.common.protocol.Errors),
and the listener's own decoding errors."""

from __future__ import annotations

import enum

__all__ = ["CodecError", "ErrorCode", "UnsupportedCompressionError"]


class CodecError(ValueError):
    """A request that does not decode: truncated, a length past its end, a bad value."""


class UnsupportedCompressionError(CodecError):
    """A codec this broker cannot read (Kafka's UNSUPPORTED_COMPRESSION_TYPE)."""


class ErrorCode(enum.IntEnum):
    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    MESSAGE_TOO_LARGE = 10
    INVALID_TOPIC_EXCEPTION = 17
    UNSUPPORTED_VERSION = 35
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    UNSUPPORTED_COMPRESSION_TYPE = 76
    INVALID_RECORD = 87
    UNKNOWN_TOPIC_ID = 100

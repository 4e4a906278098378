"""npstream: a durable, ordered, partitionless event log with a Spark connector.

``from npstream import Client`` is the entry point for applications; the
Spark data source lives in ``npstream.spark`` and is imported only by Spark,
so ``import npstream`` stays light (pyarrow and grpc, never pyspark).
"""

from __future__ import annotations

# First, before any module here imports grpc: gRPC's fork handlers off unless the
# user chose otherwise (fork_safety.py says why: grpc/grpc#43055 and Spark).
import npstream.fork_safety  # noqa: F401

# isort: split

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from npstream.client.client import Client
from npstream.client.models import (
    BatchPublishResult,
    MoveResult,
    PublishManyResult,
    PublishResult,
    RepairResult,
    SchemaVersion,
    StreamConfig,
    StreamInfo,
)
from npstream.errors import (
    AlreadyExists,
    BrokerInternalError,
    BrokerUnavailable,
    CorruptRecord,
    DiskFull,
    GroupNotFound,
    IncompatibleSchema,
    IndexOutOfRange,
    InvalidArgument,
    InvalidArgumentType,
    InvalidSchema,
    MessageTooLarge,
    MoveFailed,
    NotOwner,
    NpstreamError,
    OffsetOutOfRange,
    Overloaded,
    PermissionDenied,
    SinkConflict,
    StagingNotFound,
    StreamMoving,
    StreamNeedsRepair,
    StreamNotFound,
    Unauthenticated,
    ValueMismatch,
)
from npstream.groups.options import GroupOptions
from npstream.proto.schema import MESSAGE_SCHEMA

try:
    __version__ = _version("npstream")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = [
    "MESSAGE_SCHEMA",
    "AlreadyExists",
    "BatchPublishResult",
    "BrokerInternalError",
    "BrokerUnavailable",
    "Client",
    "CorruptRecord",
    "DiskFull",
    "GroupNotFound",
    "GroupOptions",
    "IncompatibleSchema",
    "IndexOutOfRange",
    "InvalidArgument",
    "InvalidArgumentType",
    "InvalidSchema",
    "MessageTooLarge",
    "MoveFailed",
    "MoveResult",
    "NotOwner",
    "NpstreamError",
    "OffsetOutOfRange",
    "Overloaded",
    "PermissionDenied",
    "PublishManyResult",
    "PublishResult",
    "RepairResult",
    "SchemaVersion",
    "SinkConflict",
    "StagingNotFound",
    "StreamConfig",
    "StreamInfo",
    "StreamMoving",
    "StreamNeedsRepair",
    "StreamNotFound",
    "Unauthenticated",
    "ValueMismatch",
    "__version__",
]

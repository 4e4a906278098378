"""The npstream storage engine: per-stream logs of Arrow record batches on local disk.

The public API is docs/internals.md "Storage engine"; the on-disk format is
docs/format.md. No gRPC and no SQLite here.
"""

from npstream.broker.storage.framed_append import FramedAppend
from npstream.broker.storage.log import StreamLog
from npstream.broker.storage.results import AppendResult, LogStats, ReadResult
from npstream.broker.storage.settings import AckMode, StorageSettings, StreamConfig
from npstream.broker.storage.storage import Storage
from npstream.broker.storage.value_schemas import UNTYPED, ValueSchemas

__all__ = [
    "UNTYPED",
    "AckMode",
    "AppendResult",
    "FramedAppend",
    "LogStats",
    "ReadResult",
    "Storage",
    "StorageSettings",
    "StreamConfig",
    "StreamLog",
    "ValueSchemas",
]

"""Local reads: stored frames read from the broker's segment files by a client on its machine.

Over gRPC every byte of a replay is copied through the broker's Python
process, protobuf and HTTP/2 (about 1 GB/s at best here, 0.4 GB/s for unary
calls). A client on the broker's machine can instead ask ``Locate`` where a
range is stored and pread the frames itself - the way HDFS clients read local
block files. The broker stays the authority on *what* a range is (it only
names whole, written frames, and it applies retention); this module only
reads bytes and checks them:

- the broker's boot id must be this kernel's, and the opened file must have
  the device and inode the broker stated, so a path that means another file
  here (another machine, another mount namespace) is never read;
- every frame passes the same structural and CRC32C checks as on the broker
  (npstream.proto.frames.reader), and offsets must be contiguous.

Anything else - a file deleted by retention since ``Locate``, no permission,
a torn read - raises ``LocalReadUnavailable`` and the caller reads the same
range over gRPC, which reports data loss and errors the usual way.

A typed stream's frames are decoded in the schema version their header names
(``Locate`` sends every version) and converted to the latest version when
older, so local reads give what Fetch gives (docs/typed-streams.md).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from npstream.errors import LocalReadUnavailable
from npstream.proto import pb
from npstream.proto.frames.payload import decode_payload
from npstream.proto.frames.reader import BadFrame, FrameReader
from npstream.proto.frames.record_batch import FrameHeader
from npstream.proto.host_identity import boot_id
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.proto.value_schema import conform_batch, deserialize_schema, stored_schema

__all__ = ["FrameSchemas", "LocalReadUnavailable", "LocalSpans", "check_same_host",
           "frame_schemas", "iter_local"]

# Bytes per pread: a few syscalls per 64 MiB segment, and the memory one
# chunk of batches holds while the caller consumes it.
READ_CHUNK_BYTES = 8 << 20


class FrameSchemas:
    """A stream's stored schemas by frame version, from LocateResponse.value_schemas.

    ``latest`` is the version every decoded batch is converted to (0 and
    MESSAGE_SCHEMA for an untyped stream).
    """

    def __init__(self, stored: dict[int, pa.Schema]) -> None:
        self.stored = stored
        self.latest = max(stored, default=0)
        self.schema = stored[self.latest] if stored else MESSAGE_SCHEMA

    def decode(self, header: FrameHeader, payload: memoryview) -> pa.RecordBatch:
        """The frame's batch in the latest version; LocalReadUnavailable for an unknown one."""
        version = header.schema_version
        if not version and not self.latest:
            return decode_payload(payload)
        schema = self.stored.get(version)
        if schema is None:
            raise LocalReadUnavailable(
                f"frame at offset {header.base_offset} is in value schema version {version}, "
                f"not among the versions Locate sent ({sorted(self.stored)})", permanent=False)
        batch = decode_payload(payload, schema)
        return batch if version == self.latest else conform_batch(batch, self.schema)


@functools.lru_cache(maxsize=64)
def _frame_schemas(key: tuple[tuple[int, bytes], ...]) -> FrameSchemas:
    return FrameSchemas({version: stored_schema(deserialize_schema(data))
                         for version, data in key})


def frame_schemas(value_schemas: Sequence[pb.ValueSchema]) -> FrameSchemas:
    """The FrameSchemas of a LocateResponse's value_schemas (cached: Locate repeats them)."""
    return _frame_schemas(tuple((v.version, v.arrow_schema) for v in value_schemas))


@dataclass(frozen=True)
class LocalSpans:
    """What ``Locate`` answered for [offset, next_offset)."""

    response: pb.LocateResponse
    offset: int

    @property
    def next_offset(self) -> int:
        return self.response.next_offset

    @functools.cached_property
    def schemas(self) -> FrameSchemas:
        return frame_schemas(self.response.value_schemas)


def check_same_host(response: pb.LocateResponse) -> None:
    """Raise LocalReadUnavailable(permanent) unless the broker runs on this kernel."""
    if not response.host_id:
        raise LocalReadUnavailable("the broker does not offer local reads", permanent=True)
    if response.host_id != boot_id():
        raise LocalReadUnavailable("the broker runs on another machine", permanent=True)


def iter_local(located: LocalSpans) -> Iterator[tuple[pa.RecordBatch, int, int]]:
    """(batch, next offset, frame bytes) for [offset, next_offset), read from the located files.

    Batches are cut to the range; reading stops where the caller stops
    iterating, so a long range costs memory for one chunk at a time.
    """
    check_same_host(located.response)
    schemas = located.schemas
    position, stop = located.offset, located.next_offset
    for span in located.response.spans:
        if position >= stop:
            return
        fd = _open_checked(span)
        try:
            reader = FrameReader(fd, span.position, span.end_position,
                                 read_size=READ_CHUNK_BYTES)
            while position < stop and (frame := reader.next_frame()) is not None:
                _at, header, payload = frame
                if header.next_offset <= position:
                    continue  # before the range: the span starts at an indexed frame
                if header.base_offset > position:
                    raise LocalReadUnavailable(
                        f"{span.path}: offsets jump from {position} to {header.base_offset}",
                        permanent=False)
                low = position - header.base_offset
                high = min(stop, header.next_offset) - header.base_offset
                batch = schemas.decode(header, payload)
                if low or high != header.count:
                    batch = batch.slice(low, high - low)
                position = header.base_offset + high
                yield batch, position, header.frame_size
        except BadFrame as bad:  # truncated under us (repair) or not what the broker wrote
            raise LocalReadUnavailable(f"{span.path}: {bad}", permanent=False) from None
        except OSError as exc:
            raise LocalReadUnavailable(f"{span.path}: {exc}", permanent=False) from None
        finally:
            os.close(fd)


def _open_checked(span: pb.SegmentSpan) -> int:
    try:
        fd = os.open(span.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:  # retention deleted the segment since Locate
        raise LocalReadUnavailable(f"{span.path} is gone", permanent=False) from None
    except OSError as exc:  # no permission, or no such directory on this side of a mount
        raise LocalReadUnavailable(f"cannot open {span.path}: {exc}", permanent=True) from None
    stat = os.fstat(fd)
    if (stat.st_dev, stat.st_ino) != (span.device, span.inode):
        os.close(fd)
        raise LocalReadUnavailable(
            f"{span.path} here is not the broker's file (device/inode differ)", permanent=True)
    return fd

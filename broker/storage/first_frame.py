"""A new stream's first message as its stored frame, and that frame written out as its log.

Streams as cheap as keys (docs/scaling.md): giving a stream created by its first
publish its directory, retention file and segment file before the ack (a mkdir
and two file creations, with the log objects around them) would cap creation
near 1,000 streams/s (docs/benchmarks.md). So the broker keeps such a stream's
first message as the exact frame its log would have written
(``lone_first_frame``: header and payload, byte for byte what
``SegmentList.write_payload`` writes at offset 0) in the metadata database (the
registry's nursery, npstream.broker.streams.nursery), and writes it out as the
stream's first segment only when the log is first opened
(``write_first_segment``): on its next publish, a read, a group, a move. A
stream nobody touches again never gets a directory.

Writing it out is idempotent: a crash before the nursery row is deleted
leaves the row and the file; the next open finds the segment already starting
with the frame and leaves it alone (appends made after it stay), or finds it
torn (a crash mid-write) and writes it again.
"""

from __future__ import annotations

import os
from pathlib import Path

from npstream.broker.storage.appender import new_id_prefix
from npstream.broker.storage.dir_sync import (
    SYNCFS_AVAILABLE,
    fsync_dir_shared,
    sync_filesystem_shared,
)
from npstream.broker.storage.files import fsync_dir, segment_path
from npstream.broker.storage.settings import StreamConfig
from npstream.broker.storage.small_append import (
    LoneMessage,
    build_stored_batch,
    lone_payload,
    remember_lone_template,
)
from npstream.broker.storage.stream_files import write_retention_config
from npstream.proto.frames.record_batch import encode_frame

__all__ = ["lone_first_frame", "write_first_segment"]


def lone_first_frame(value: bytes, timestamp_ms: int) -> bytes:
    """The frame (header + payload) of a lone message stored at offset 0 of a new log.

    Its broker-filled id uses a fresh id prefix, as a newly opened log's would.
    """
    prefix = new_id_prefix().encode()
    payload: bytes | None = lone_payload(value, 0, timestamp_ms, prefix)
    if payload is None:
        built = build_stored_batch(LoneMessage(value).pending().table, 0, timestamp_ms,
                                   prefix).serialize()
        remember_lone_template(built)
        payload = built.to_pybytes()
    header, _ = encode_frame(payload, base_offset=0, count=1, min_timestamp=timestamp_ms,
                             max_timestamp=timestamp_ms)
    return header + payload


def _holds_prefix(path: Path, frame: bytes) -> bool:
    try:
        with open(path, "rb") as segment:
            return segment.read(len(frame)) == frame
    except FileNotFoundError:
        return False


def write_first_segment(directory: Path, frame: bytes, config: StreamConfig) -> None:
    """Make ``frame`` the durable start of the stream's first segment (module docstring).

    The caller holds the stream's name lock and the log is not open. Returns
    once the directory, its files and the frame are durable, so the nursery
    row may go.
    """
    try:
        directory.mkdir()
        created = True
    except FileExistsError:
        created = False
    except FileNotFoundError:  # the streams root itself is missing
        directory.mkdir(parents=True, exist_ok=True)
        created = True
    write_retention_config(directory, config, new=created)
    path = segment_path(directory, 0)
    # Written out before a crash: keep it (appends may follow it), make it durable again.
    if created or not _holds_prefix(path, frame):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(frame)
            while view:
                view = view[os.write(fd, view):]
            if not SYNCFS_AVAILABLE:
                os.fdatasync(fd)
        finally:
            os.close(fd)
    elif not SYNCFS_AVAILABLE:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
    if SYNCFS_AVAILABLE:  # one syncfs shared by every stream written out meanwhile
        sync_filesystem_shared(directory)
    else:
        fsync_dir(directory)
        fsync_dir_shared(directory.parent)

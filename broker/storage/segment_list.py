"""The ordered segments of one stream directory, and every change made to them on disk.

The segment store (segment_store.py) holds it beside the append lock, the
views and the dedup window; this class owns the files: writing a batch as
frames (rolling segments by size, age and offset range on the way, undoing
everything if a write fails), deleting segments from the head, and cutting
the log back for truncate_to (truncation.py). Every method is called with
the log's append lock held.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from npstream.broker import faults
from npstream.broker.errors import BrokerError, CorruptRecordError
from npstream.broker.storage.batch_builder import serialize_frames
from npstream.broker.storage.dir_sync import (
    SYNCFS_AVAILABLE,
    fsync_dir_shared,
    sync_filesystem_shared,
)
from npstream.broker.storage.errors import UndoFailedError
from npstream.broker.storage.extent_check import extent_of, record_extent
from npstream.broker.storage.file_cache import FileCache
from npstream.broker.storage.files import fsync_dir, segment_path
from npstream.broker.storage.prebuilt import PrebuiltFrame, stamp_payload
from npstream.broker.storage.reader import LogView, iter_frames
from npstream.broker.storage.segment import Segment
from npstream.broker.storage.settings import StorageSettings, StreamConfig
from npstream.broker.storage.staged_segment import StagedSegment, Stamp, StoredSchemas
from npstream.broker.storage.stream_files import (
    LogExtent,
    remove_log_extent,
    write_retention_config,
)
from npstream.proto.frames.record_batch import FLAG_PRODUCER_IDS, FrameHeader, encode_frame

__all__ = ["SegmentList", "UndoFailedError"]

log = logging.getLogger(__name__)

_MAX_RELATIVE_OFFSET = 2**32 - 1


class SegmentList:
    """The segments of one log, oldest first; the last one is active. Append lock held."""

    def __init__(
        self, name: str, directory: Path, segments: list[Segment], *,
        settings: StorageSettings, cache: FileCache,
    ) -> None:
        self.name = name
        self.directory = directory
        self.segments = segments
        self._settings = settings
        self._cache = cache
        self._files_unsynced = False  # a new directory and segment wait for sync_tail

    def __len__(self) -> int:
        return len(self.segments)

    @property
    def tail(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    # ------------------------------------------------------------------ writing

    def ensure_active(self, end_offset: int, config: StreamConfig) -> Segment:
        """The active segment, creating the stream directory and first segment if needed."""
        if self.segments:
            return self.segments[-1]
        try:  # one mkdir instead of exists() + mkdir: a stream's first write is hot
            self.directory.mkdir()
            created = True
        except FileExistsError:
            created = False
        except FileNotFoundError:  # the streams root itself is missing
            self.directory.mkdir(parents=True, exist_ok=True)
            created = True
        # No schema.arrow: a directory without one is in MESSAGE_SCHEMA (check_schema).
        write_retention_config(self.directory, config, new=created)
        segment = Segment(self.directory, end_offset)
        segment.create_file(self._cache)
        if SYNCFS_AVAILABLE:  # made durable with the first data, by sync_tail (dir_sync.py)
            self._files_unsynced = True
        else:
            fsync_dir(self.directory)
            if created:  # streams created together share the parent's fsync
                fsync_dir_shared(self.directory.parent)
        self.segments.append(segment)
        return segment

    def write_batch(
        self, batch: pa.RecordBatch, supplied: pa.BooleanArray | None, timestamp: int,
        schema_version: int = 0,
    ) -> list[pa.RecordBatch]:
        """Write ``batch`` as frames of at most max_batch_bytes; all or nothing.

        ``supplied`` marks the rows with producer ids; ``schema_version`` is
        the value schema version ``batch`` is in (0: untyped, MESSAGE_SCHEMA),
        written into every frame header. Returns the parts written with the
        producer-ids flag (their ids enter the dedup window). On an OSError
        every frame of the batch is removed again before it propagates
        (UndoFailedError if that fails too).
        """
        first = batch.column(0)[0].as_py()
        flagged: list[pa.RecordBatch] = []
        frames = []
        for start, count, payload in serialize_frames(batch, self._settings.max_batch_bytes):
            flags = 0
            if supplied is not None and pc.any(supplied.slice(start, count)).as_py():
                flags = FLAG_PRODUCER_IDS
                flagged.append(batch.slice(start, count))
            frames.append((payload, *encode_frame(
                payload, base_offset=first + start, count=count,
                min_timestamp=timestamp, max_timestamp=timestamp, flags=flags,
                schema_version=schema_version,
            )))
        self._write_frames(frames, timestamp)
        return flagged

    def write_payload(self, payload: pa.Buffer | bytes, first: int, count: int,
                      timestamp: int) -> None:
        """Write one frame whose payload is already serialized (a lone message); all or nothing.

        Its rows carry no producer ids (no flags), so nothing enters the dedup window.
        """
        header_bytes, header = encode_frame(payload, base_offset=first, count=count,
                                            min_timestamp=timestamp, max_timestamp=timestamp)
        self._write_frames([(payload, header_bytes, header)], timestamp)

    def write_prebuilt(
        self, frames: list[PrebuiltFrame], first: int, timestamp: int,
        stored_schema: StoredSchemas,
    ) -> list[pa.RecordBatch]:
        """Stamp and write prebuilt frames from offset ``first`` on; all or nothing.

        Like write_batch, without building or serializing anything: each payload
        is stamped in place (prebuilt.py; decoded in ``stored_schema`` of its
        version) and written as it is, its version in the header. Returns the
        stamped batches of the frames flagged as carrying producer ids.
        """
        flagged: list[pa.RecordBatch] = []
        ready = []
        base = first
        for frame in frames:  # every frame checked and stamped before the first byte is written
            batch = stamp_payload(frame.payload, base, timestamp,
                                  stored_schema(frame.schema_version))
            if batch.num_rows != frame.count:
                raise ValueError(f"prebuilt frame at offset {base} holds {batch.num_rows} rows, "
                                 f"not {frame.count}")
            if frame.flags & FLAG_PRODUCER_IDS:
                flagged.append(batch)
            payload = pa.py_buffer(frame.payload)
            ready.append((payload, *encode_frame(
                payload, base_offset=base, count=frame.count,
                min_timestamp=timestamp, max_timestamp=timestamp, flags=frame.flags,
                schema_version=frame.schema_version,
            )))
            base += frame.count
        self._write_frames(ready, timestamp)
        return flagged

    def adopt(self, staged: StagedSegment, first: int, stamp: Stamp) -> list[pa.RecordBatch]:
        """Make a staged file the newest segment, at offset ``first`` (staged_segment.py).

        The file was stamped and fsynced for ``first`` (``stamp``: what
        StagedSegment.stamp returned). The active segment is closed (an empty
        one is replaced, since it has the same name) and the file renamed into
        the stream directory; it becomes the active segment. Returns the
        (offset, id) columns of frames carrying producer ids.
        """
        headers, flagged = stamp
        faults.hit("storage.renaming", staged.path)
        tail = self.segments[-1]
        target = segment_path(self.directory, first)
        if not tail.is_empty:
            tail.sync(self._cache)
            tail.seal()
        try:
            self._cache.forget(target)  # an empty tail's file is replaced: drop its open fd
            os.replace(staged.path, target)
            fsync_dir(self.directory)
            fsync_dir(staged.path.parent)
        except OSError:
            if tail.sealed and not tail.is_empty:
                tail.delete_index_files()  # it stays the active segment
            raise
        segment = Segment(self.directory, first)
        for position, header in headers:
            segment.record_frame(position, header, self._settings.index_interval_bytes)
        if tail.is_empty:
            self.segments[-1] = segment
        else:
            self.segments.append(segment)
        log.debug("stream %s: adopted staged file %s as segment %s (offsets [%d, %d), %d bytes)",
                 self.name, staged.path.name, target.name, first, segment.next_offset,
                 segment.size)
        faults.hit("storage.adopted", staged.path)
        return flagged

    def _write_frames(self, frames: list[tuple[pa.Buffer | bytes, bytes, FrameHeader]],
                      timestamp: int) -> None:
        """Write encoded frames at the end of the log, rolling when due; all or nothing.

        On an OSError every frame already written is removed again before it
        propagates (UndoFailedError if that fails too).
        """
        segment_count = len(self.segments)
        tail_size = self.segments[-1].size
        try:
            for payload, header_bytes, header in frames:
                self._roll_if_due(header.frame_size, header.count, timestamp)
                self.segments[-1].write_frame(
                    self._cache, header_bytes, payload, header,
                    self._settings.index_interval_bytes,
                )
        except OSError:
            self._roll_back(segment_count, tail_size)
            raise

    def _roll_back(self, segment_count: int, tail_size: int) -> None:
        """Undo a batch that failed half way; raise OSError if even that fails."""
        try:
            for segment in self.segments[segment_count:]:
                segment.delete(self._cache)
            del self.segments[segment_count:]
            tail = self.segments[-1]
            if tail.size != tail_size or tail.sealed:
                tail.delete_index_files()
                tail.truncate_file(self._cache, tail_size)
                self.segments[-1] = self.rescan(tail.base_offset)
        except (OSError, BrokerError) as exc:
            raise UndoFailedError(errno.EIO, f"stream '{self.name}': could not undo a failed "
                                  f"write: {exc}") from exc

    def _roll_if_due(self, frame_size: int, count: int, timestamp: int) -> None:
        tail = self.segments[-1]
        if tail.is_empty:
            return
        reason = None
        if tail.size + frame_size > self._settings.segment_bytes:
            reason = f"size: {tail.size} + {frame_size} bytes > segment_bytes"
        elif timestamp - tail.first_timestamp >= self._settings.segment_age_ms:
            reason = f"age: first message at {tail.first_timestamp} ms, now {timestamp} ms"
        elif tail.next_offset + count - tail.base_offset > _MAX_RELATIVE_OFFSET:
            reason = "relative offsets would overflow"
        if reason is not None:
            self.roll(reason)

    def roll(self, reason: str) -> None:
        """Close the active segment (fsync, seal) and start a new one at its end."""
        old = self.segments[-1]
        old.sync(self._cache)
        old.seal()
        new = Segment(self.directory, old.next_offset)
        new.create_file(self._cache)
        record_extent(self.directory, extent_of([*self.segments, new]), self.name,
                      durable=False)  # made durable by the directory's fsync
        fsync_dir(self.directory)
        self.segments.append(new)
        log.info("stream %s: rolled segment %s (offsets [%d, %d), %d bytes; %s); "
                 "new segment starts at offset %d", self.name, old.path.name, old.base_offset,
                 old.next_offset, old.size, reason, new.base_offset)

    def sync_tail(self) -> None:
        """fsync the active segment; a just-created one with its directory (ensure_active).

        A new stream's directory, files and first writes are made durable by
        one syncfs shared with every stream created meanwhile, instead of four
        fsyncs of its own.
        """
        if not self.segments:
            return
        if self._files_unsynced:
            tail = self.segments[-1]
            faults.hit("storage.fsync", tail.path, tail.size)
            sync_filesystem_shared(self.directory.parent)
            self._files_unsynced = False
            return
        self.segments[-1].sync(self._cache)

    # ------------------------------------------------------------------ removing

    def detach_head(self, count: int) -> list[Segment]:
        """Remove the first ``count`` segments from the list (files stay until delete_files)."""
        doomed = self.segments[:count]
        del self.segments[:count]
        return doomed

    def delete_files(self, doomed: list[Segment]) -> None:
        """Delete detached head segments; the new first segment is recorded first.

        The tail is fsynced before the (durable) record: it names the tail's
        size, which may include writes never fsynced (``ack="write"``), and a
        power loss must not leave the record on disk without them.
        """
        if self.segments:
            self._record_synced(extent_of(self.segments), self.segments[-1])
        for segment in doomed:
            segment.delete(self._cache)
        fsync_dir(self.directory)

    def _record_synced(self, extent: LogExtent | None, tail: Segment) -> None:
        """Record ``extent`` durably once ``tail`` (whose size it names) is fsynced.

        Without the fsync the record could reach the disk without writes never
        fsynced (``ack="write"``) and a power loss would refuse the stream. If
        the fsync fails (a full disk may refuse it) the old record, which may be
        above what is about to remain, is removed: the next open checks nothing.
        """
        try:
            tail.sync(self._cache)
        except OSError as exc:
            log.warning("stream %s: could not fsync %s before recording the log extent (%s); "
                        "the next open does not check the files against a record",
                        self.name, tail.path, exc)
            remove_log_extent(self.directory)
            return
        record_extent(self.directory, extent, self.name, durable=True)

    def truncate(self, view: LogView, offset: int) -> None:
        """Remove messages [offset, end); ``offset`` starts a stored frame (the caller checks)."""
        number = view.segment_number(offset)
        segment = self.segments[number]
        cut = segment.size
        for _segment, position, _header, _payload in iter_frames(view, self._cache, offset):
            cut = position
            break
        self._record_synced(LogExtent(self.segments[0].base_offset, segment.base_offset, cut,
                                      offset), segment)  # lowered before the files are cut
        for later in self.segments[number + 1 :]:
            later.delete(self._cache)
        del self.segments[number + 1 :]
        segment.delete_index_files()
        segment.truncate_file(self._cache, cut)
        self.segments[number] = self.rescan(segment.base_offset)
        fsync_dir(self.directory)

    def rescan(self, base_offset: int) -> Segment:
        segment, bad = Segment.scan(self.directory, base_offset, self._cache,
                                    self._settings.index_interval_bytes)
        if bad is not None:
            raise CorruptRecordError(segment.path, bad.position, bad.detail)
        return segment

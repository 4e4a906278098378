"""Where a shared group's rows come from: fresh ones read ahead from the log, spans read again.

A shared group hands out fresh messages in offset order and reads
redelivered spans back from the log (leases keep offsets, not rows). Both
are reads of the stream's log as stored Arrow batches; this module is that
reading, apart from the lease bookkeeping of shared.py:

* ``FreshRows``: the never-delivered rows read ahead, up to
  FRESH_READ_CHUNK messages or FRESH_READ_BYTES per read, kept as record
  batches until handed out, so a stored batch of 10,000 rows is read once,
  not once per Receive. Rows the log's last write stored come from memory
  (StreamLog.recent_rows): a member following the tail gets a new message
  without it being read back from the file or decoded.
* ``read_span``: the rows of a redelivered span, read from the log again;
  ``read_spans`` reads many spans close together with one read of the range
  that covers them (see there).
"""

from __future__ import annotations

from collections import deque
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from npstream.broker.groups.deliveries import Rows
from npstream.broker.groups.tuning import (
    FRESH_READ_BYTES,
    FRESH_READ_CHUNK,
    SPAN_GROUP_OFFSETS,
)
from npstream.proto.frames.payload import decode_payload

if TYPE_CHECKING:
    from npstream.broker.storage import StreamLog

__all__ = ["SPAN_READ_BYTES", "FreshRows", "part_bytes", "read_span", "read_spans"]

# Read from the log per redelivered span read (bytes); a span is read in pieces.
SPAN_READ_BYTES = FRESH_READ_BYTES


class FreshRows:
    """Rows read from the log and not handed out yet: offsets [next fresh, ``next``).

    Stored batches, or rows the log already had as Python values (a lone
    message). Not thread-safe: used under the group's lock.
    """

    def __init__(self, next_offset: int) -> None:
        self._parts: deque[Rows] = deque()
        self._count = 0  # rows in _parts
        self._bytes = 0  # their bytes (part_bytes)
        # Bytes per row of what was read so far (>= 1): how many redeliveries fit a lease's bytes.
        self._read_rows = self._read_bytes = 0
        self.next = next_offset
        # The stored batches of the last read with their first offsets, handed out or
        # not: they hold no more memory than the read did while any of it is
        # undelivered, and the group drops them when nothing is in flight (forget_read).
        self._read: list[tuple[int, Rows]] = []
        self._read_firsts = np.zeros(0, np.int64)  # the firsts of _read (_keep sets both)

    def clear(self, next_offset: int) -> None:
        self._parts.clear()
        self._count = self._bytes = 0
        self.next = next_offset
        self._keep([])

    def _keep(self, read: list[tuple[int, Rows]]) -> None:
        """What the latest read brought: a group following the tail keeps the last
        write's batch (or nothing, for a lone message), not an older file read."""
        self._read = read
        self._read_firsts = np.array([first for first, _batch in read], np.int64)

    def forget_read(self) -> None:
        """Let the last read's memory go once no row of it can be redelivered (none in flight)."""
        if not self._parts:
            self._keep([])

    def kept(self, stream_log: StreamLog, ranges: list[tuple[int, int]]) -> list[Rows] | None:
        """The rows of ``ranges`` (in the order given) out of the last read, as few
        parts; None unless it holds them all and the log still does.

        Why: a redelivery read from the log reads (and checks the CRC of) its
        whole stored batch, ~1 MB for one message of a 10,000-row batch of
        100 B; with ordering="key" every held message is such a redelivery,
        most of them within the read their batch was handed out from. The
        rows of many short ranges are gathered with one take per stored batch,
        not sliced out one part per range.
        """
        read = self._read
        if not read or not ranges:
            return None
        lo = min(start for start, _end in ranges)
        hi = max(end for _start, end in ranges)
        last_first, last = read[-1]
        if (lo < max(read[0][0], stream_log.start_offset)  # retention: the log decides
                or hi > min(last_first + len(last), stream_log.end_offset)):
            return None
        if len(ranges) == 1:
            return _cut(read, lo, hi)
        offsets = _offsets(ranges)
        which = np.searchsorted(self._read_firsts, offsets, side="right") - 1
        cuts = np.flatnonzero(which[1:] != which[:-1]) + 1
        parts: list[Rows] = []
        for a, b in pairwise([0, *cuts.tolist(), len(offsets)]):
            first, batch = read[which[a]]
            parts.append(batch.take(pa.array(offsets[a:b] - first)))
        return parts

    def row_bytes(self) -> int:
        """The mean bytes of a row read so far (1 before any read)."""
        return max(1, self._read_bytes // self._read_rows) if self._read_rows else 1

    def _append(self, parts: list[Rows]) -> None:
        for part in parts:
            size = part_bytes(part)
            self._parts.append(part)
            self._count += len(part)
            self._bytes += size
            self._read_rows += len(part)
            self._read_bytes += size

    def take(self, stream_log: StreamLog, limit: int, max_bytes: int) -> list[Rows]:
        """Up to ``limit`` rows and about ``max_bytes`` (at least one row) in offset order,
        read from the log as needed.

        Reads until the request is covered, so one Subscribe batch (or
        Receive) takes everything ready that fits, not just what was left
        of the last read; never more than ``max_bytes`` ahead (plus one
        read), so large messages do not pile up for a reader that does not
        take them. Raises OffsetOutOfRangeError when retention moved the
        log's start past the next row.
        """
        while (self._count < limit and self._bytes < max_bytes
               and self.next < stream_log.end_offset):
            recent = stream_log.recent_rows(self.next)
            if recent is not None:  # what the last write stored: no file read, no decoding
                self._keep([] if isinstance(recent, list) else [(self.next, recent)])
                self._append([recent])
                self.next += len(recent)
                continue
            result = stream_log.read(self.next, max_messages=FRESH_READ_CHUNK,
                                     max_bytes=FRESH_READ_BYTES, latest=True)
            if result.next_offset <= self.next:
                break
            schema = stream_log.value_schemas.stored_schema(result.schema_version)
            batches = [decode_payload(payload, schema) for payload in result.batches]
            self._append(batches)
            self._keep(_with_starts(batches))
            self.next = result.next_offset
        taken: list[Rows] = []
        count = size = 0
        while count < limit and size < max_bytes and self._parts:
            part = self._parts.popleft()
            part_size = part_bytes(part)
            wanted = limit - count
            if part_size > max_bytes - size and len(part) > 1:  # rows of a mean size that fit
                wanted = min(wanted, max(1, len(part) * (max_bytes - size) // part_size))
            if len(part) > wanted:
                rest = part[wanted:]
                self._parts.appendleft(rest)
                part = part[:wanted]
                part_size -= part_bytes(rest)
            taken.append(part)
            count += len(part)
            size += part_size
            self._count -= len(part)
            self._bytes -= part_size
        return taken


def part_bytes(part: Rows) -> int:
    """The bytes a part's rows hold (a sliced batch: its share of the buffers)."""
    if isinstance(part, pa.RecordBatch):
        return int(part.nbytes)
    return sum(len(row.value) + len(row.key or b"") for row in part)


def read_span(stream_log: StreamLog, start: int, end: int) -> list[Rows]:
    """The rows of ``[start, end)`` read from the log again (a redelivery).

    Rows the log no longer holds (retention moved its start) are not
    returned; the caller's next look drops them from its table.
    """
    parts: list[Rows] = []
    offset = start
    while offset < end:
        result = stream_log.read(offset, max_messages=end - offset,
                                 max_bytes=SPAN_READ_BYTES, end_offset=end, latest=True,
                                 whole=True)  # sliced here: no re-encoding of the rows kept
        if result.next_offset <= offset:
            break
        schema = stream_log.value_schemas.stored_schema(result.schema_version)
        batches = [decode_payload(payload, schema) for payload in result.batches]
        parts += _cut(_with_starts(batches), offset, end)
        offset = result.next_offset
    return parts


def read_spans(stream_log: StreamLog, spans: list[tuple[int, int]]) -> list[list[Rows]]:
    """The rows of each ``[start, end)`` of ``spans``, in the order given.

    Why: a read returns whole stored batches, so reading a one-message span
    out of a stored batch of 10,000 rows reads (and checks the CRC of) the
    whole batch. With ordering="key" and keys that repeat, held messages are
    released one at a time, each a span of one offset a few offsets from the
    last: read one by one, a batch of 1,000 such redeliveries cost ~16 us per
    message. Spans within SPAN_GROUP_OFFSETS of each other are read as one
    covering range and sliced out of it.
    """
    out: list[list[Rows]] = [[] for _ in spans]
    order = sorted(range(len(spans)), key=lambda i: spans[i][0])
    group: list[int] = []

    def flush() -> None:
        if len(group) == 1:
            index = group[0]
            out[index] = read_span(stream_log, *spans[index])
        elif group:
            lo = spans[group[0]][0]
            hi = max(spans[i][1] for i in group)
            covering = _with_starts(read_span(stream_log, lo, hi))
            for index in group:
                out[index] = _cut(covering, *spans[index])
        group.clear()

    for index in order:
        if group and spans[index][1] - spans[group[0]][0] > SPAN_GROUP_OFFSETS:
            flush()
        group.append(index)
    flush()
    return out


def _offsets(ranges: list[tuple[int, int]]) -> np.ndarray:
    """Every offset of the ``[start, end)`` ranges, range after range, without a loop."""
    los = np.array([start for start, _end in ranges], np.int64)
    lengths = np.array([end for _start, end in ranges], np.int64) - los
    firsts = np.cumsum(lengths) - lengths  # where each range starts in the output
    return np.repeat(los - firsts, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


def _with_starts(parts: list[pa.RecordBatch] | list[Rows]) -> list[tuple[int, Rows]]:
    """Each part of a read with its first offset (parts of a read are Arrow batches)."""
    return [(part.column(0)[0].as_py(), part) for part in parts
            if not isinstance(part, list) and part.num_rows]


def _cut(parts: list[tuple[int, Rows]], start: int, end: int) -> list[Rows]:
    """The rows of ``[start, end)`` out of parts with their first offsets, as slices."""
    rows: list[Rows] = []
    for first, part in parts:
        lo, hi = max(0, start - first), min(len(part), end - first)
        if hi > lo:
            rows.append(part if (lo, hi) == (0, len(part)) else part[lo:hi])
    return rows

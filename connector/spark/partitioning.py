"""Pure offset-range arithmetic for the Spark reader: task splitting and row budgets.

No I/O here, so every rule is table-tested. Ranges are half-open
``[start, end)`` per stream. Two jobs:

- ``split_ranges``: turn one range per stream into Spark partitions, at most
  ``max_records_per_partition`` messages each and at least ``min_partitions``
  in total (when there are that many messages). Without either, a batch of at
  least ``AUTO_SPLIT_MIN_ROWS`` messages per extra partition is split up to
  ``parallelism`` partitions (``auto_partitions``). Parallelism is therefore not
  tied to the number of streams, unlike Kafka's partition count.
- ``prorate``: share a ``maxOffsetsPerTrigger`` budget between streams in
  proportion to their backlog, as Spark's Kafka source does (small backlogs
  get at least one message so no stream starves).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from npstream.errors import InvalidArgument

__all__ = ["AUTO_SPLIT_MIN_ROWS", "OffsetRange", "auto_partitions", "prorate", "split_ranges"]

# ---------------------------------------------------------------- tuning
# Smallest partition the default split makes. A Spark task costs about
# 50-100 ms to schedule and start (Python worker, gRPC channel, first fetch);
# 250,000 messages take a task about 0.25 s at 1 M msg/s (docs/spark.md), so
# the overhead stays small. Planning knows offsets, not bytes, so the limit is
# on messages; at 100 B that is about 25 MB per partition, at 1 KB 250 MB.
AUTO_SPLIT_MIN_ROWS = 250_000


@dataclass(frozen=True)
class OffsetRange:
    """Messages ``[start, end)`` of one stream."""

    stream: str
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def _apportion(sizes: list[int], parts: int) -> list[int]:
    """How many pieces each range gets so the total is ``parts`` (one at least each).

    Largest remainder: each range first gets floor(share), then the pieces
    left over go to the ranges whose pieces are currently largest, so the
    resulting pieces are as even as possible. A range never gets more pieces
    than it has messages. Ties break by position, keeping the result stable.
    """
    total = sum(sizes)
    counts = [max(1, min(size, size * parts // total)) for size in sizes]
    while sum(counts) < parts:
        candidates = [i for i, size in enumerate(sizes) if counts[i] < size]
        if not candidates:
            break
        best = max(candidates, key=lambda i: (sizes[i] / counts[i], -i))
        counts[best] += 1
    return counts


def _even_pieces(rng: OffsetRange, pieces: int) -> list[OffsetRange]:
    """Split a range into ``pieces`` contiguous parts whose sizes differ by at most one."""
    base, extra = divmod(rng.size, pieces)
    result: list[OffsetRange] = []
    start = rng.start
    for index in range(pieces):
        end = start + base + (1 if index < extra else 0)
        result.append(OffsetRange(rng.stream, start, end))
        start = end
    return result


def auto_partitions(total_rows: int, parallelism: int,
                    min_rows: int = AUTO_SPLIT_MIN_ROWS) -> int:
    """Partitions of a batch of ``total_rows`` when the user set no split option.

    Up to ``parallelism`` (Spark's default parallelism), but never pieces of
    fewer than ``min_rows`` messages: a small batch stays one partition per
    stream. A function of its arguments only, so a re-planned batch splits
    the same way.
    """
    if parallelism <= 0:
        raise InvalidArgument(f"parallelism must be > 0, got {parallelism}")
    return max(1, min(parallelism, total_rows // min_rows))


def split_ranges(
    ranges: list[OffsetRange],
    *,
    max_records_per_partition: int | None = None,
    min_partitions: int | None = None,
    parallelism: int | None = None,
) -> list[OffsetRange]:
    """Split per-stream ranges into Spark partitions.

    Empty ranges are dropped. Each range becomes
    ``max(ceil(size / max_records_per_partition), its share of min_partitions)``
    even pieces, so no piece exceeds ``max_records_per_partition`` and the total
    is at least ``min_partitions`` unless there are fewer messages than that.
    When neither is set, ``parallelism`` (if given) sets ``min_partitions``
    to ``auto_partitions(total, parallelism)``.
    Order follows the input, then offsets: the same input always gives the
    same partitions, which keeps re-planned batches identical.
    """
    for limit, name in ((max_records_per_partition, "max_records_per_partition"),
                        (min_partitions, "min_partitions"), (parallelism, "parallelism")):
        if limit is not None and limit <= 0:
            raise InvalidArgument(f"{name} must be > 0, got {limit}")
    non_empty = [rng for rng in ranges if rng.size > 0]
    if not non_empty:
        return []
    sizes = [rng.size for rng in non_empty]
    if min_partitions is None and max_records_per_partition is None and parallelism:
        min_partitions = auto_partitions(sum(sizes), parallelism)
    counts = [1] * len(non_empty)
    if min_partitions is not None and min_partitions > len(non_empty):
        counts = _apportion(sizes, min_partitions)
    if max_records_per_partition is not None:
        counts = [max(count, math.ceil(size / max_records_per_partition))
                  for count, size in zip(counts, sizes, strict=True)]
    return [piece for rng, count in zip(non_empty, counts, strict=True)
            for piece in _even_pieces(rng, count)]


def prorate(limit: int, start: Mapping[str, int], latest: Mapping[str, int]) -> dict[str, int]:
    """End offsets that admit about ``limit`` messages, shared by backlog.

    ``start`` holds where each stream's next batch begins (streams missing from
    it begin at 0); ``latest`` the streams' current ends. Each stream with a
    backlog gets ``limit * backlog / total`` messages, rounded down, or rounded
    up when below one so that a small stream is never starved (Spark's Kafka
    rateLimit rule; the total may therefore exceed ``limit`` by at most the
    number of streams). Streams without a backlog keep their latest offset.
    """
    if limit <= 0:
        raise InvalidArgument(f"limit must be > 0, got {limit}")
    backlog = {stream: end - start.get(stream, 0) for stream, end in latest.items()
               if end - start.get(stream, 0) > 0}
    total = sum(backlog.values())
    if total <= limit:
        return dict(latest)
    result: dict[str, int] = {}
    for stream, end in latest.items():
        size = backlog.get(stream)
        if size is None:
            result[stream] = end
            continue
        share = limit * size / total
        admitted = math.ceil(share) if share < 1 else math.floor(share)
        result[stream] = min(end, start.get(stream, 0) + admitted)
    return result

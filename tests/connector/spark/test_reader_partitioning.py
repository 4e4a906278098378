"""Range splitting and per-trigger budgets, table-tested (pure functions)."""

from __future__ import annotations

import pytest

from npstream.spark.partitioning import (
    AUTO_SPLIT_MIN_ROWS,
    OffsetRange,
    auto_partitions,
    prorate,
    split_ranges,
)

R = OffsetRange


def sizes(pieces: list[OffsetRange]) -> list[tuple[str, int, int]]:
    return [(p.stream, p.start, p.end) for p in pieces]


@pytest.mark.parametrize("ranges,max_records,min_parts,expected", [
    # no options: one partition per non-empty stream range
    ([R("a", 0, 10), R("b", 5, 5)], None, None, [("a", 0, 10)]),
    ([R("a", 3, 10), R("b", 0, 2)], None, None, [("a", 3, 10), ("b", 0, 2)]),
    # maxRecordsPerPartition: even pieces, none larger than the limit
    ([R("a", 0, 10)], 3, None, [("a", 0, 3), ("a", 3, 6), ("a", 6, 8), ("a", 8, 10)]),
    ([R("a", 0, 10)], 10, None, [("a", 0, 10)]),
    ([R("a", 0, 10)], 100, None, [("a", 0, 10)]),
    # minPartitions: shared by size; the largest range gets the extra pieces
    ([R("a", 0, 10), R("b", 0, 10), R("c", 0, 10)], None, 4,
     [("a", 0, 5), ("a", 5, 10), ("b", 0, 10), ("c", 0, 10)]),
    ([R("a", 0, 100), R("b", 0, 1)], None, 4,
     [("a", 0, 34), ("a", 34, 67), ("a", 67, 100), ("b", 0, 1)]),
    # minPartitions never splits below one message per piece
    ([R("a", 0, 3)], None, 10, [("a", 0, 1), ("a", 1, 2), ("a", 2, 3)]),
    # minPartitions already satisfied: nothing split
    ([R("a", 0, 10), R("b", 0, 10)], None, 2, [("a", 0, 10), ("b", 0, 10)]),
    # both: the stricter of the two per range
    ([R("a", 0, 12), R("b", 0, 2)], 5, 4,
     [("a", 0, 4), ("a", 4, 8), ("a", 8, 12), ("b", 0, 2)]),
    # nothing to read
    ([R("a", 4, 4)], 10, 3, []),
    ([], None, 2, []),
])
def test_split_ranges_table(ranges, max_records, min_parts, expected):
    pieces = split_ranges(ranges, max_records_per_partition=max_records, min_partitions=min_parts)
    assert sizes(pieces) == expected


@pytest.mark.parametrize("total,min_parts,max_records", [
    (1000, 7, None), (999, 13, 50), (17, 16, None), (5000, 3, 333), (64, 64, 1),
])
def test_split_ranges_covers_every_offset_once(total, min_parts, max_records):
    ranges = [R("a", 100, 100 + total // 3), R("b", 0, total - total // 3)]
    pieces = split_ranges(ranges, max_records_per_partition=max_records, min_partitions=min_parts)
    covered = {(p.stream, o) for p in pieces for o in range(p.start, p.end)}
    assert len(covered) == sum(p.size for p in pieces) == total
    assert len(pieces) >= min(min_parts, total)
    if max_records:
        assert max(p.size for p in pieces) <= max_records
    assert split_ranges(ranges, max_records_per_partition=max_records,
                        min_partitions=min_parts) == pieces  # deterministic


M = AUTO_SPLIT_MIN_ROWS


@pytest.mark.parametrize("total,parallelism,expected", [
    (0, 2, 1), (M - 1, 2, 1), (M, 2, 1), (2 * M - 1, 2, 1), (2 * M, 2, 2),
    (10_000_000, 2, 2), (10_000_000, 8, 8), (10_000_000, 1000, 10_000_000 // M),
    (3 * M, 8, 3),
])
def test_auto_partitions_table(total, parallelism, expected):
    assert auto_partitions(total, parallelism) == expected


@pytest.mark.parametrize("ranges,max_records,min_parts,expected", [
    # default split: one stream of 10 M messages on 2 cores -> two halves
    ([R("a", 0, 10_000_000)], None, None, [("a", 0, 5_000_000), ("a", 5_000_000, 10_000_000)]),
    # a batch too small to split stays one partition per stream
    ([R("a", 0, 2 * M - 1)], None, None, [("a", 0, 2 * M - 1)]),
    # already as many streams as the parallelism: nothing split
    ([R("a", 0, 4 * M), R("b", 0, 4 * M)], None, None, [("a", 0, 4 * M), ("b", 0, 4 * M)]),
    # either option overrides the default split
    ([R("a", 0, 10_000_000)], None, 1, [("a", 0, 10_000_000)]),
    ([R("a", 0, 10_000_000)], 10_000_000, None, [("a", 0, 10_000_000)]),
])
def test_split_ranges_with_parallelism_table(ranges, max_records, min_parts, expected):
    pieces = split_ranges(ranges, max_records_per_partition=max_records,
                          min_partitions=min_parts, parallelism=2)
    assert sizes(pieces) == expected
    assert split_ranges(ranges, max_records_per_partition=max_records,
                        min_partitions=min_parts, parallelism=2) == pieces  # re-planned: same


def test_split_ranges_rejects_non_positive_limits():
    with pytest.raises(ValueError, match="max_records_per_partition must be > 0, got 0"):
        split_ranges([R("a", 0, 1)], max_records_per_partition=0)
    with pytest.raises(ValueError, match="min_partitions must be > 0, got -1"):
        split_ranges([R("a", 0, 1)], min_partitions=-1)


@pytest.mark.parametrize("limit,start,latest,expected", [
    # equal backlogs share equally
    (40, {"a": 0, "b": 0}, {"a": 60, "b": 60}, {"a": 20, "b": 20}),
    # proportional to backlog
    (40, {"a": 0, "b": 0}, {"a": 30, "b": 70}, {"a": 12, "b": 28}),
    # a tiny backlog still gets one message (never starved)
    (10, {"a": 0, "b": 0}, {"a": 1, "b": 99}, {"a": 1, "b": 9}),
    # everything fits: latest as is
    (100, {"a": 5, "b": 0}, {"a": 10, "b": 20}, {"a": 10, "b": 20}),
    # streams without backlog keep their offset; new streams begin at 0
    (10, {"a": 50}, {"a": 50, "new": 40}, {"a": 50, "new": 10}),
    # starts part-way
    (6, {"a": 100, "b": 7}, {"a": 200, "b": 107}, {"a": 103, "b": 10}),
])
def test_prorate_table(limit, start, latest, expected):
    assert prorate(limit, start, latest) == expected


def test_prorate_rejects_non_positive_limit():
    with pytest.raises(ValueError, match="limit must be > 0, got 0"):
        prorate(0, {}, {"a": 1})

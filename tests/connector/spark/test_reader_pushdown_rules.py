"""How pushed filters narrow a batch read (pure: Narrowing rules, no broker)."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)

from npstream.spark.batch_reader import Narrowing, NpstreamPushdownBatchReader
from npstream.spark.options import parse_read_options

OFF = ("offset",)
TS = ("timestamp",)


def narrowed(*filters):
    reader = NpstreamPushdownBatchReader(parse_read_options({"stream": "a"}, "batch", env={}))
    left = list(reader.pushFilters(list(filters)))
    return reader._narrowing, left


@pytest.mark.parametrize("filter_,low,high", [
    (EqualTo(OFF, 7), 7, 8),
    (GreaterThan(OFF, 7), 8, None),
    (GreaterThanOrEqual(OFF, 7), 7, None),
    (LessThan(OFF, 7), 0, 7),
    (LessThanOrEqual(OFF, 7), 0, 8),
    (LessThan(OFF, -5), 0, 0),
])
def test_push_offset_comparison_is_applied_exactly(filter_, low, high):
    narrowing, left = narrowed(filter_)
    assert (narrowing.offset_from, narrowing.offset_until) == (low, high)
    assert left == []


def test_push_offset_in_narrows_to_min_max_and_is_rechecked():
    filter_ = In(OFF, (9, 3, 5))
    narrowing, left = narrowed(filter_)
    assert (narrowing.offset_from, narrowing.offset_until) == (3, 10)
    assert left == [filter_]


def test_push_several_offset_filters_intersect():
    narrowing, left = narrowed(GreaterThanOrEqual(OFF, 10), LessThan(OFF, 20),
                               GreaterThan(OFF, 12), LessThanOrEqual(OFF, 30))
    assert (narrowing.offset_from, narrowing.offset_until) == (13, 20)
    assert left == []


def test_push_stream_equality_and_in_restrict_streams():
    narrowing, left = narrowed(In(("stream",), ("a", "b")), EqualTo(("stream",), "b"))
    assert narrowing.streams == frozenset({"b"})
    assert narrowing.allows("b") and not narrowing.allows("a")
    assert left == []


def test_push_timestamp_bounds_use_whole_milliseconds_and_are_rechecked():
    t = dt.datetime(1970, 1, 1, 0, 0, 1, 500, tzinfo=dt.UTC)  # 1000.5 ms
    filters = [GreaterThanOrEqual(TS, t), LessThanOrEqual(TS, t)]
    narrowing, left = narrowed(*filters)
    assert (narrowing.time_from_ms, narrowing.time_until_ms) == (1001, 1001)
    assert left == filters
    narrowing, _ = narrowed(GreaterThan(TS, t), LessThan(TS, t))
    assert (narrowing.time_from_ms, narrowing.time_until_ms) == (1001, 1001)
    whole = dt.datetime(1970, 1, 1, 0, 0, 2, tzinfo=dt.UTC)  # 2000 ms
    narrowing, _ = narrowed(GreaterThan(TS, whole), LessThanOrEqual(TS, whole))
    assert (narrowing.time_from_ms, narrowing.time_until_ms) == (2001, 2001)
    narrowing, _ = narrowed(GreaterThanOrEqual(TS, whole), LessThan(TS, whole))
    assert (narrowing.time_from_ms, narrowing.time_until_ms) == (2000, 2000)


@pytest.mark.parametrize("filter_", [
    Not(EqualTo(OFF, 1)),
    IsNotNull(("key",)),
    EqualTo(("value",), b"x"),
    StringStartsWith(("id",), "m"),
    EqualTo(OFF, 1.5),
    EqualTo(OFF, True),
    GreaterThan(TS, "2025-01-01"),
    In(OFF, (1, None, "x")),
])
def test_push_unsupported_filters_are_returned_untouched(filter_):
    narrowing, left = narrowed(filter_)
    assert narrowing == Narrowing()
    assert left == [filter_] and left[0] is filter_

"""Parsing of times, durations and sizes (npstream.proto.units): SDK, CLI, config, Spark."""

from __future__ import annotations

import datetime as dt

import pytest

from npstream.proto.units import parse_duration_ms, parse_size, parse_timestamp_ms


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2025-01-01T00:00:00Z", 1_735_689_600_000),
        ("2025-01-01T01:00:00+01:00", 1_735_689_600_000),
        ("2025-01-01T00:00:00", 1_735_689_600_000),
        (dt.datetime(2025, 1, 1, tzinfo=dt.UTC), 1_735_689_600_000),
        (dt.datetime(2025, 1, 1), 1_735_689_600_000),
        (1_735_689_600_123, 1_735_689_600_123),
        ("1735689600123", 1_735_689_600_123),
    ],
)
def test_parse_timestamp_accepted_forms_give_epoch_ms(value: object, expected: int) -> None:
    assert parse_timestamp_ms(value) == expected


@pytest.mark.parametrize("value", ["yesterday", "", True, None, [1]])
def test_parse_timestamp_bad_value_names_accepted_forms(value: object) -> None:
    with pytest.raises(ValueError, match=r"ISO-8601|epoch milliseconds"):
        parse_timestamp_ms(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("500ms", 500), ("30s", 30_000), ("2m", 120_000), ("7d", 604_800_000), ("1w", 604_800_000),
     (1.5, 1500), (10, 10_000), ("10", 10_000), (dt.timedelta(minutes=1), 60_000)],
)
def test_parse_duration_units_give_milliseconds(value: object, expected: int) -> None:
    assert parse_duration_ms(value) == expected


@pytest.mark.parametrize("value", ["7 days", "-1s", -3, "ms", True])
def test_parse_duration_bad_value_raises_with_units(value: object) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration_ms(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("512", 512), (4096, 4096), ("64MiB", 64 << 20), ("1GiB", 1 << 30), ("1GB", 10**9),
     ("1.5KiB", 1536)],
)
def test_parse_size_units_give_bytes(value: object, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize("value", ["1 gigabyte", -1, "MiB", False])
def test_parse_size_bad_value_raises_with_units(value: object) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(value)

"""Result dataclasses: built from the wire messages, readable reprs, JSON-ready dicts."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from npstream.client.models import BatchPublishResult, RepairResult, StreamConfig, StreamInfo
from npstream.proto import pb


def _info(**extra: object) -> pb.StreamInfo:
    return pb.StreamInfo(
        name="orders",
        config=pb.StreamConfig(max_age_ms=604_800_000, max_bytes=0, dedup_window_ms=120_000,
                               max_message_bytes=1_048_576),
        start_offset=5, end_offset=12, message_count=7, bytes_on_disk=4096,
        first_timestamp_ms=1735689600123, last_timestamp_ms=1735689601000,
        created_ms=1735689500000, segment_count=1, **extra,
    )


def test_stream_info_from_pb_copies_every_field():
    info = StreamInfo.from_pb(_info())
    assert info == StreamInfo(
        name="orders",
        config=StreamConfig(604_800_000, 0, 120_000, 1_048_576),
        start_offset=5, end_offset=12, message_count=7, bytes_on_disk=4096,
        first_timestamp_ms=1735689600123, last_timestamp_ms=1735689601000,
        created_ms=1735689500000, segment_count=1, error="",
    )
    assert info.first_timestamp == dt.datetime(2025, 1, 1, 0, 0, 0, 123000, tzinfo=dt.UTC)
    assert info.last_timestamp == dt.datetime(2025, 1, 1, 0, 0, 1, tzinfo=dt.UTC)


def test_stream_info_empty_stream_has_no_datetimes():
    info = StreamInfo.from_pb(pb.StreamInfo(name="e"))
    assert (info.first_timestamp, info.last_timestamp, info.created) == (None, None, None)


def test_stream_info_is_frozen():
    info = StreamInfo.from_pb(_info())
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.end_offset = 3  # type: ignore[misc]


def test_stream_info_repr_shows_raw_ms_and_utc_time():
    text = repr(StreamInfo.from_pb(_info(error="corrupt record in x at byte 9")))
    assert text.startswith("StreamInfo(name='orders', start_offset=5, end_offset=12, ")
    assert "first_timestamp_ms=1735689600123 (2025-01-01T00:00:00.123Z)" in text
    assert "dedup_window_ms=120000" in text
    assert text.endswith("error='corrupt record in x at byte 9')")


def test_stream_info_to_dict_nests_config_and_adds_iso_times():
    data = StreamInfo.from_pb(_info()).to_dict()
    assert data["config"] == {"max_age_ms": 604_800_000, "max_bytes": 0,
                              "dedup_window_ms": 120_000, "max_message_bytes": 1_048_576}
    assert data["first_timestamp"] == "2025-01-01T00:00:00.123Z"
    assert data["created_ms"] == 1735689500000


def test_repair_result_from_pb():
    result = RepairResult.from_pb(pb.RepairStreamResponse(
        stream=_info(), truncated_bytes=17, detail="00000000000000000000.log@4096"))
    assert (result.stream.name, result.truncated_bytes, result.detail) == (
        "orders", 17, "00000000000000000000.log@4096")


def test_batch_publish_result_repr_abbreviates_long_offsets():
    result = BatchPublishResult(0, 100_000, [], list(range(100_000)))
    assert repr(result) == (
        "BatchPublishResult(first_offset=0, stored_count=100000, duplicates=[], "
        "offsets=[0, 1, 2, ..., 99999] (100000 rows))"
    )
    assert result.last_offset == 99_999

"""Stream administration through the SDK against a real broker process."""

from __future__ import annotations

import datetime as dt

import pytest

from npstream import (
    AlreadyExists,
    InvalidArgument,
    OffsetOutOfRange,
    StreamConfig,
    StreamNotFound,
)
from npstream.proto import pb

GIB = 1 << 30
MIB = 1 << 20


def test_create_stream_with_unit_strings_returns_effective_config(client, stream_name):
    info = client.create_stream(stream_name, max_age="7d", max_bytes="1GiB",
                                dedup_window=dt.timedelta(minutes=2), max_message_bytes="1MiB")
    assert info.name == stream_name
    assert info.config == StreamConfig(max_age_ms=7 * 86_400_000, max_bytes=GIB,
                                       dedup_window_ms=120_000, max_message_bytes=MIB)
    assert (info.start_offset, info.end_offset, info.message_count) == (0, 0, 0)
    assert info.created is not None and info.error == ""
    assert client.stream_info(stream_name) == info


def test_create_stream_same_config_twice_is_idempotent(client, stream_name):
    first = client.create_stream(stream_name, max_age=60)
    assert client.create_stream(stream_name, max_age=60) == first


def test_create_stream_different_config_raises_already_exists_unless_exist_ok(client, stream_name):
    client.create_stream(stream_name, max_age="1h")
    with pytest.raises(AlreadyExists, match=stream_name):
        client.create_stream(stream_name, max_age="2h")
    kept = client.create_stream(stream_name, max_age="2h", exist_ok=True)
    assert kept.config.max_age_ms == 3_600_000


def test_stream_info_unknown_stream_raises_stream_not_found(client, stream_name):
    with pytest.raises(StreamNotFound) as info:
        client.stream_info(stream_name)
    assert str(info.value) == f"stream '{stream_name}' does not exist"
    assert isinstance(info.value, LookupError)


def test_broker_rejects_bad_name_with_invalid_argument_through_call(client):
    # The SDK checks names itself; a raw call shows the broker's own check is mapped too.
    with pytest.raises(InvalidArgument, match=r"'\.\./etc'"):
        client.call("StreamService.DescribeStream", pb.DescribeStreamRequest(name="../etc"))


def test_list_streams_prefix_pattern_and_every_page(client, stream_name, monkeypatch):
    names = [f"{stream_name}-{i}" for i in range(5)]
    for name in names:
        client.create_stream(name)
    client.create_stream(f"x{stream_name}")
    monkeypatch.setattr("npstream.client.stream_admin.LIST_PAGE_SIZE", 2)  # 5 streams = 3 pages
    assert [s.name for s in client.list_streams(prefix=f"{stream_name}-")] == names
    assert [s.name for s in client.list_streams(pattern=f"{stream_name}-[13]")] == [
        names[1], names[3]]
    assert stream_name not in {s.name for s in client.list_streams(prefix="zzz-none")}


def test_update_stream_changes_only_given_settings(client, stream_name):
    client.create_stream(stream_name, max_age="1d", max_bytes="10MiB", dedup_window="1m")
    info = client.update_stream(stream_name, dedup_window=0, max_bytes="20MiB")
    assert info.config.max_age_ms == 86_400_000
    assert info.config.max_bytes == 20 * MIB
    assert info.config.dedup_window_ms == 0
    assert client.stream_info(stream_name).config == info.config


def test_delete_stream_existing_true_then_gone_and_false(client, stream_name):
    client.create_stream(stream_name)
    client.publish(stream_name, "x")
    assert client.delete_stream(stream_name) is True
    with pytest.raises(StreamNotFound):
        client.stream_info(stream_name)
    assert client.delete_stream(stream_name) is False


def test_delete_messages_before_offset_moves_start_and_reads_below_fail(client, stream_name):
    client.publish_batch(stream_name, [{"value": str(i)} for i in range(10)])
    info = client.delete_messages(stream_name, before_offset=4)
    assert (info.start_offset, info.end_offset, info.message_count) == (4, 10, 6)
    assert client.fetch(stream_name, 4).column("value").to_pylist()[0] == b"4"
    with pytest.raises(OffsetOutOfRange) as err:
        client.fetch(stream_name, 3)
    assert (err.value.stream, err.value.offset, err.value.start_offset,
            err.value.end_offset) == (stream_name, 3, 4, 10)
    assert str(err.value) == (f"offset 3 is out of range for stream '{stream_name}': "
                              "start_offset=4, end_offset=10")


def test_delete_messages_beyond_end_raises_out_of_range(client, stream_name):
    client.publish(stream_name, "a")
    with pytest.raises(OffsetOutOfRange) as err:
        client.delete_messages(stream_name, before_offset=5)
    assert (err.value.offset, err.value.start_offset, err.value.end_offset) == (5, 0, 1)


def test_delete_messages_all_empties_stream_and_offsets_keep_growing(client, stream_name):
    client.publish_batch(stream_name, [{"value": "a"}, {"value": "b"}, {"value": "c"}])
    info = client.delete_messages(stream_name)
    assert (info.start_offset, info.end_offset, info.message_count) == (3, 3, 0)
    assert client.fetch(stream_name, 3).num_rows == 0
    assert client.publish(stream_name, "d").offset == 3


def test_repair_stream_healthy_stream_cuts_nothing(client, stream_name):
    client.publish_batch(stream_name, [{"value": "a"}, {"value": "b"}])
    result = client.repair_stream(stream_name)
    assert result.truncated_bytes == 0
    assert (result.stream.start_offset, result.stream.end_offset) == (0, 2)

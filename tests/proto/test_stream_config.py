"""One StreamConfig for the broker and the SDK, matching the wire message field for field."""

from __future__ import annotations

import pytest

import npstream
from npstream.broker.storage import StreamConfig as StorageStreamConfig
from npstream.proto import pb
from npstream.proto.stream_config import STREAM_CONFIG_FIELDS, StreamConfig


def test_sdk_and_storage_use_the_contract_class():
    assert npstream.StreamConfig is StreamConfig
    assert StorageStreamConfig is StreamConfig


def test_fields_are_the_wire_message_fields_in_order():
    assert tuple(f.name for f in pb.StreamConfig.DESCRIPTOR.fields) == STREAM_CONFIG_FIELDS


def test_wire_round_trip_and_defaults():
    config = StreamConfig(max_age_ms=1, max_bytes=2, dedup_window_ms=3, max_message_bytes=4)
    assert StreamConfig.from_pb(config.to_pb()) == config
    assert StreamConfig() == StreamConfig(0, 0, 0, 0)
    assert repr(StreamConfig(max_bytes=5)) == (
        "StreamConfig(max_age_ms=0, max_bytes=5, dedup_window_ms=0, max_message_bytes=0)")


@pytest.mark.parametrize("bad", [-1, True, 1.5, "1"])
def test_a_bad_value_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"stream config max_bytes=.* must be an integer >= 0"):
        StreamConfig(max_bytes=bad)

"""npstream.proto.wire: hand-joined bytes fields parse to what protobuf itself would build."""

from __future__ import annotations

import pyarrow as pa
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from npstream.proto import pb
from npstream.proto.wire import encode_with_bytes, split_bytes_field, varint


@given(st.integers(min_value=1, max_value=(1 << 63) - 1))
def test_varint_matches_protobuf(value):
    encoded = pb.FetchResponse(next_offset=value).SerializeToString()  # proto3 omits 0
    assert encoded == b"\x10" + varint(value)


@given(st.lists(st.binary(max_size=300), max_size=5), st.integers(0, 1 << 40))
def test_repeated_bytes_field_parses_as_protobuf_would(batches, offset):
    rest = pb.FetchResponse(next_offset=offset, start_offset=1, end_offset=offset + 9, count=3)
    views = [memoryview(b) for b in batches]
    parsed = pb.FetchResponse.FromString(encode_with_bytes(rest, "batches", views))
    expected = pb.FetchResponse(batches=batches, next_offset=offset, start_offset=1,
                                end_offset=offset + 9, count=3)
    assert parsed == expected


def test_singular_bytes_field_from_an_arrow_buffer():
    data = pa.py_buffer(b"x" * 70_000)
    raw = encode_with_bytes(pb.PublishRequest(stream="s", ack=pb.ACK_WRITE), "arrow_stream",
                            [data])
    # Fields come in another order than protobuf writes them; the message is the same.
    assert pb.PublishRequest.FromString(raw) == pb.PublishRequest(
        stream="s", ack=pb.ACK_WRITE, arrow_stream=b"x" * 70_000)


@given(st.text(max_size=20), st.binary(max_size=2000), st.sampled_from([0, 1, 2]),
       st.lists(st.binary(max_size=50), max_size=3))
def test_split_bytes_field_gives_views_and_the_other_fields(stream, arrow, ack, values):
    message = pb.PublishRequest(stream=stream, arrow_stream=arrow, ack=ack)
    rest, views = split_bytes_field(message.SerializeToString(), pb.PublishRequest,
                                    "arrow_stream", bail_on="messages")
    assert rest == pb.PublishRequest(stream=stream, ack=ack)
    assert [bytes(v) for v in views] == ([arrow] if arrow else [])
    with_messages = pb.PublishRequest(stream=stream, messages=[pb.Message(value=v) for v in values],
                                      arrow_stream=arrow)
    parsed, views = split_bytes_field(with_messages.SerializeToString(), pb.PublishRequest,
                                      "arrow_stream", bail_on="messages")
    assert parsed.stream == stream and [m.value for m in parsed.messages] == values
    assert [bytes(v) for v in views] == ([arrow] if arrow else [])


def test_split_bytes_field_rejects_a_field_running_past_the_end():
    raw = pb.PublishRequest(stream="s", arrow_stream=b"x" * 10).SerializeToString()[:-3]
    with pytest.raises(DecodeError):
        split_bytes_field(raw, pb.PublishRequest, "arrow_stream")

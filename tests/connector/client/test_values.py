"""Value, key and header encoding (npstream.client.values): the one rule the SDK and CLI share."""

from __future__ import annotations

import pyarrow as pa
import pytest

from npstream.client.values import (
    _columnar_table,
    _row_table,
    decode_text,
    decode_value,
    encode_headers,
    encode_key,
    encode_value,
    messages_to_table,
    ms_to_iso,
)
from npstream.errors import InvalidArgument
from npstream.proto.schema import HEADERS_TYPE


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"\x00\xffraw", b"\x00\xffraw"),
        (bytearray(b"ab"), b"ab"),
        (memoryview(b"mv"), b"mv"),
        ("héllo", "héllo".encode()),
        ({"a": 1, "b": [1, 2]}, b'{"a":1,"b":[1,2]}'),
        ([1, "x"], b'[1,"x"]'),
        (42, b"42"),
        (None, b"null"),
        ({"ü": "ß"}, '{"ü":"ß"}'.encode()),
    ],
)
def test_encode_value_by_type_gives_documented_bytes(value, expected):
    assert encode_value(value) == expected


def test_encode_value_unserializable_raises_invalid_argument_naming_type():
    with pytest.raises(InvalidArgument, match="value of type object cannot be sent"):
        encode_value(object())


def test_encode_value_nan_is_rejected_as_not_json():
    with pytest.raises(InvalidArgument, match="float"):
        encode_value(float("nan"))


def test_encode_key_accepts_str_bytes_none_and_rejects_int():
    assert encode_key("k") == b"k"
    assert encode_key(b"\x01") == b"\x01"
    assert encode_key(None) is None
    with pytest.raises(InvalidArgument, match="key must be bytes or str, got int: 7"):
        encode_key(7)


def test_encode_headers_str_and_bytes_values_become_bytes():
    assert encode_headers({"a": "x", "b": b"\x00"}) == {"a": b"x", "b": b"\x00"}
    assert encode_headers(None) == {}


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"a": 1}, "header 'a' must be bytes or str, got int"),
        ({1: "x"}, "header name must be str, got int: 1"),
        (["a"], "headers must be a mapping"),
    ],
)
def test_encode_headers_bad_input_raises_invalid_argument(headers, message):
    with pytest.raises(InvalidArgument, match=message):
        encode_headers(headers)


def test_messages_to_table_value_only_has_one_binary_column():
    table = messages_to_table([{"value": "a"}, {"value": b"b"}, {"value": {"n": 1}}])
    assert table.schema == pa.schema([pa.field("value", pa.binary())])
    assert table.column("value").to_pylist() == [b"a", b"b", b'{"n":1}']


def test_messages_to_table_all_fields_keep_nulls_where_absent():
    table = messages_to_table([
        {"value": "a", "id": "i1", "key": "k", "headers": {"h": "v"}},
        {"value": "b"},
    ])
    assert table.column_names == ["value", "id", "key", "headers"]
    assert table.column("id").to_pylist() == ["i1", None]
    assert table.column("key").to_pylist() == [b"k", None]
    assert table.column("headers").type == HEADERS_TYPE
    assert table.column("headers").to_pylist() == [[("h", b"v")], None]


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([{"id": "x"}], "message 0 has no value"),
        ([{"value": "a"}, {"value": "b", "partition": 1}],
         r"message 1 has unknown key\(s\) \['partition'\]"),
        ([{"value": "a"}, "raw"], "message 1 must be a dict"),
        ([{"value": "a", "id": 5}], "message 0: id must be str, got int: 5"),
        ([{"value": "a", "key": 5}], "message 0: key must be bytes or str"),
    ],
)
def test_messages_to_table_bad_message_raises_with_its_index(messages, message):
    with pytest.raises(InvalidArgument, match=message):
        messages_to_table(messages)


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        (b'{"a": [1, 2]}', {"a": [1, 2]}),
        (b"12", 12),
        (b"plain text", "plain text"),
        (b"NaN", "NaN"),
        ("é".encode(), "é"),
        (b"\xff\x00", "/wA="),
    ],
)
def test_decode_value_json_then_text_then_base64(data, shown):
    assert decode_value(data) == shown


def test_decode_text_non_utf8_is_base64_and_none_stays_none():
    assert decode_text(b"key") == "key"
    assert decode_text(b"\xfe") == "/g=="
    assert decode_text(None) is None


@pytest.mark.parametrize(
    ("ms", "iso"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (1735689600123, "2025-01-01T00:00:00.123Z"),
        (1999, "1970-01-01T00:00:01.999Z"),
    ],
)
def test_ms_to_iso_formats_utc_with_milliseconds(ms, iso):
    assert ms_to_iso(ms) == iso


@pytest.mark.parametrize("messages", [
    [{"value": b"a"}, {"value": b"bc"}],
    [{"value": "é"}, {"value": "b", "id": "i2"}],
    [{"value": b"a", "id": "i1", "key": "k1"}, {"value": b"b", "key": "k2"}],
    [{"value": b"a", "id": None, "key": None}],
    [{"value": bytearray(b"a"), "key": b"k"}],
    [{"value": b"a"}, {"value": "b", "key": b"k"}, {"value": b"c", "key": "k"}],  # mixed
])
def test_messages_to_table_plain_values_built_by_column_equal_row_by_row(messages):
    columnar = _columnar_table(messages)
    assert columnar is not None
    assert columnar.equals(_row_table(messages))
    assert messages_to_table(messages).equals(columnar)


@pytest.mark.parametrize("messages", [
    [{"value": {"n": 1}}],                       # JSON
    [{"value": b"a", "headers": {"h": "v"}}],    # headers
    [{"value": b"a", "id": b"i"}],               # bytes id: the row rules reject it
    [{"value": b"a"}, {"id": "x"}],              # missing value
    [{"value": b"a", "partition": 1}],           # unknown key
    [{"value": b"a"}, "raw"],                    # not a dict
])
def test_messages_to_table_other_inputs_take_the_row_by_row_rules(messages):
    assert _columnar_table(messages) is None

"""Publishing through the SDK against a real broker: values, keys, headers, ids, batches."""

from __future__ import annotations

import pyarrow as pa
import pytest

from npstream import MESSAGE_SCHEMA, InvalidArgument, PublishResult


def _rows(client, stream, offset=0):
    return client.fetch(stream, offset).to_pylist()


def test_publish_bytes_str_and_json_values_round_trip(client, stream_name):
    offsets = [
        client.publish(stream_name, b"\x00\xffbin").offset,
        client.publish(stream_name, "héllo").offset,
        client.publish(stream_name, {"n": 1, "tags": ["a"]}).offset,
        client.publish(stream_name, 7).offset,
    ]
    assert offsets == [0, 1, 2, 3]
    values = client.fetch(stream_name, 0).column("value").to_pylist()
    assert values == [b"\x00\xffbin", "héllo".encode(), b'{"n":1,"tags":["a"]}', b"7"]


def test_publish_key_headers_and_id_are_stored(client, stream_name):
    result = client.publish(stream_name, "v", id="order-1", key="customer-7",
                            headers={"source": "web", "raw": b"\x01"}, ack="write")
    assert result == PublishResult(offset=0, duplicate=False)
    (row,) = _rows(client, stream_name)
    assert (row["offset"], row["id"], row["key"], row["value"]) == (0, "order-1", b"customer-7",
                                                                    b"v")
    assert sorted(row["headers"]) == [("raw", b"\x01"), ("source", b"web")]
    assert row["timestamp"].tzinfo is not None


def test_publish_without_id_gets_unique_broker_id_and_no_key(client, stream_name):
    client.publish(stream_name, "a")
    client.publish(stream_name, "b")
    rows = _rows(client, stream_name)
    assert rows[0]["id"] and rows[1]["id"] and rows[0]["id"] != rows[1]["id"]
    assert rows[0]["key"] is None


def test_publish_duplicate_id_within_window_reports_original_offset(client, stream_name):
    client.create_stream(stream_name, dedup_window="10m")
    assert client.publish(stream_name, "first", id="a") == PublishResult(0, False)
    assert client.publish(stream_name, "other", id="b") == PublishResult(1, False)
    assert client.publish(stream_name, "again", id="a") == PublishResult(0, True)
    assert client.stream_info(stream_name).end_offset == 2
    assert [r["value"] for r in _rows(client, stream_name)] == [b"first", b"other"]


def test_publish_oversized_message_raises_invalid_argument_and_stores_nothing(client, stream_name):
    client.create_stream(stream_name, max_message_bytes=1000)
    client.publish(stream_name, "small")
    with pytest.raises(InvalidArgument) as err:
        client.publish(stream_name, b"x" * 2000)
    assert str(err.value).startswith(f"message 0 for stream '{stream_name}' is ")
    assert "over the stream's max_message_bytes=1000; nothing was stored" in str(err.value)
    assert client.stream_info(stream_name).end_offset == 1


def test_publish_bad_value_type_raises_before_sending(client, stream_name):
    with pytest.raises(InvalidArgument, match="value of type set cannot be sent"):
        client.publish(stream_name, {1, 2})


def test_publish_batch_dicts_offsets_and_duplicates_in_input_order(client, stream_name):
    client.create_stream(stream_name, dedup_window="10m")
    client.publish(stream_name, "zero", id="a")
    result = client.publish_batch(stream_name, [
        {"value": "one", "id": "b", "key": b"k1", "headers": {"h": "1"}},
        {"value": "dup of zero", "id": "a"},
        {"value": {"two": 2}},
        {"value": "dup in batch", "id": "b"},
    ])
    assert result.offsets == [1, 0, 2, 1]
    assert result.duplicates == [(1, 0), (3, 1)]
    assert (result.first_offset, result.stored_count, result.last_offset) == (1, 2, 2)
    rows = _rows(client, stream_name)
    assert [r["value"] for r in rows] == [b"zero", b"one", b'{"two":2}']
    assert (rows[1]["key"], rows[1]["headers"]) == (b"k1", [("h", b"1")])


def test_publish_batch_table_100k_rows_exact_offsets_over_several_requests(client, stream_name):
    client.publish(stream_name, "before")
    values = [f"{i:08d}".encode() * 12 for i in range(100_000)]  # 96 B each, ~10 MB in all
    table = pa.table({"value": pa.array(values, pa.binary()),
                      "key": pa.array([str(i % 7) for i in range(100_000)])})
    result = client.publish_batch(stream_name, table)
    assert result.offsets == list(range(1, 100_001))
    assert (result.first_offset, result.stored_count, result.duplicates) == (1, 100_000, [])
    back = pa.Table.from_batches(list(client.read_range(stream_name, 1, 100_001)))
    assert back.schema == MESSAGE_SCHEMA
    assert back.column("offset").to_pylist() == list(range(1, 100_001))
    assert back.column("value").to_pylist() == values
    assert back.column("key").to_pylist()[:8] == [b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"0"]


def test_publish_batch_record_batch_with_string_values_and_ids(client, stream_name):
    batch = pa.record_batch({"value": ["a", "b"], "id": ["x1", "x2"]})
    result = client.publish_batch(stream_name, batch)
    assert result.offsets == [0, 1]
    assert [(r["id"], r["value"]) for r in _rows(client, stream_name)] == [("x1", b"a"),
                                                                            ("x2", b"b")]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (pa.table({"value": [b"a"], "partition": [1]}),
         r"unknown publish column\(s\) \['partition'\]"),
        (pa.table({"id": ["a"]}), "no 'value' column"),
        (pa.table({"value": pa.array([b"a", None])}), "publish column 'value' has 1 null"),
    ],
)
def test_publish_batch_bad_table_raises_invalid_argument(client, stream_name, table, message):
    with pytest.raises(InvalidArgument, match=message):
        client.publish_batch(stream_name, table)


def test_publish_batch_rejected_later_request_keeps_earlier_and_says_so(client, stream_name):
    client.create_stream(stream_name, max_message_bytes="5MiB")
    big = b"x" * (3 << 20)
    messages = [{"value": big}, {"value": big}, {"value": b"y" * (6 << 20)}]
    with pytest.raises(InvalidArgument) as err:
        client.publish_batch(stream_name, messages)
    assert "max_message_bytes=5242880; nothing was stored" in str(err.value)
    assert err.value.__notes__ == [
        "rows 0..1 of this batch were stored before the error (offsets 0..1); "
        "rows from 2 on were not"]
    assert client.stream_info(stream_name).end_offset == 2


def test_publish_batch_empty_list_returns_empty_result_without_call(client, stream_name):
    result = client.publish_batch(stream_name, [])
    assert (result.first_offset, result.stored_count, result.offsets) == (-1, 0, [])

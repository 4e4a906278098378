"""Reading through the SDK against a real broker: fetch, long poll, exact ranges, time seeks."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pyarrow as pa
import pytest

from npstream import MESSAGE_SCHEMA, OffsetOutOfRange, StreamNotFound


def _publish_in_batches(client, stream, count, per_batch):
    for start in range(0, count, per_batch):
        client.publish_batch(stream, [{"value": str(i)} for i in range(start, start + per_batch)])


def test_fetch_empty_stream_returns_empty_table_with_message_schema(client, stream_name):
    client.create_stream(stream_name)
    table = client.fetch(stream_name, 0)
    assert table.num_rows == 0
    assert table.schema == MESSAGE_SCHEMA


def test_fetch_unknown_stream_raises_stream_not_found(client, stream_name):
    with pytest.raises(StreamNotFound, match=f"stream '{stream_name}' does not exist"):
        client.fetch(stream_name, 0)


def test_fetch_batches_max_messages_and_next_offset(client, stream_name):
    _publish_in_batches(client, stream_name, 30, 10)
    batches, next_offset = client.fetch_batches(stream_name, 5, max_messages=12)
    offsets = pa.Table.from_batches(batches).column("offset").to_pylist()
    assert offsets == list(range(5, 17))
    assert next_offset == 17
    assert all(b.schema == MESSAGE_SCHEMA for b in batches)


def test_fetch_end_offset_is_exclusive(client, stream_name):
    _publish_in_batches(client, stream_name, 20, 20)
    table = client.fetch(stream_name, 3, end_offset=9)
    assert table.column("offset").to_pylist() == [3, 4, 5, 6, 7, 8]
    assert table.column("value").to_pylist() == [str(i).encode() for i in range(3, 9)]


def test_fetch_past_end_raises_out_of_range_with_offsets(client, stream_name):
    _publish_in_batches(client, stream_name, 3, 3)
    assert client.fetch(stream_name, 3).num_rows == 0  # offset == end: empty, no error
    with pytest.raises(OffsetOutOfRange) as err:
        client.fetch(stream_name, 4)
    assert (err.value.stream, err.value.offset, err.value.start_offset, err.value.end_offset) == (
        stream_name, 4, 0, 3)


def test_fetch_with_wait_wakes_on_publish(client, stream_name):
    client.create_stream(stream_name)
    timer = threading.Timer(0.3, lambda: client.publish(stream_name, "late"))
    started = time.monotonic()
    timer.start()
    try:
        table = client.fetch(stream_name, 0, wait=20.0)
    finally:
        timer.join()
    elapsed = time.monotonic() - started
    assert table.column("value").to_pylist() == [b"late"]
    assert 0.25 <= elapsed < 5.0


def test_fetch_with_wait_and_no_publish_returns_empty_after_wait(client, stream_name):
    client.create_stream(stream_name)
    started = time.monotonic()
    assert client.fetch(stream_name, 0, wait=0.5).num_rows == 0
    assert 0.4 <= time.monotonic() - started < 5.0


@pytest.fixture(params=["local", "grpc"])
def reader(request, broker):
    """A client reading ranges from the broker's files (local) or over gRPC (ReadRange)."""
    from npstream import Client

    with Client(broker.address, local_reads=request.param == "local") as c:
        yield c


def test_read_range_returns_exactly_the_range_across_stored_batches(client, reader, stream_name):
    _publish_in_batches(client, stream_name, 50, 7)
    batches = list(reader.read_range(stream_name, 8, 43))
    table = pa.Table.from_batches(batches)
    assert table.column("offset").to_pylist() == list(range(8, 43))
    assert table.column("value").to_pylist() == [str(i).encode() for i in range(8, 43)]
    again = pa.Table.from_batches(list(reader.read_range(stream_name, 8, 43)))
    assert again.equals(table)


def test_read_range_over_grpc_small_max_bytes_uses_many_replies_and_stays_exact(
        broker, client, stream_name):
    from npstream import Client

    client.publish_batch(stream_name, [{"value": b"v" * 1000} for _ in range(40)])
    with Client(broker.address, local_reads=False) as remote:
        batches = list(remote.read_range(stream_name, 3, 37, max_bytes=4000))
    assert len(batches) >= 8
    offsets = pa.Table.from_batches(batches).column("offset").to_pylist()
    assert offsets == list(range(3, 37))


def test_read_range_empty_range_yields_nothing(client, reader, stream_name):
    _publish_in_batches(client, stream_name, 5, 5)
    assert list(reader.read_range(stream_name, 2, 2)) == []


def test_read_range_beyond_end_raises_out_of_range(client, reader, stream_name):
    _publish_in_batches(client, stream_name, 5, 5)
    with pytest.raises(OffsetOutOfRange) as err:
        list(reader.read_range(stream_name, 0, 8))
    assert (err.value.start_offset, err.value.end_offset) == (0, 5)


def test_read_range_start_removed_by_delete_raises_out_of_range(client, reader, stream_name):
    _publish_in_batches(client, stream_name, 10, 10)
    client.delete_messages(stream_name, before_offset=6)
    with pytest.raises(OffsetOutOfRange) as err:
        list(reader.read_range(stream_name, 2, 10))
    assert (err.value.offset, err.value.start_offset, err.value.end_offset) == (2, 6, 10)


def test_read_range_unknown_stream_raises_stream_not_found(reader, stream_name):
    with pytest.raises(StreamNotFound):
        list(reader.read_range(stream_name, 0, 1))


def test_offset_for_timestamp_datetime_iso_and_epoch_ms(client, stream_name):
    client.publish(stream_name, "a")
    time.sleep(0.05)
    client.publish(stream_name, "b")
    stamps = client.fetch(stream_name, 0).column("timestamp").cast(pa.int64()).to_pylist()
    second = stamps[1]
    as_datetime = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=second)
    iso = as_datetime.isoformat().replace("+00:00", "Z")
    assert client.offset_for_timestamp(stream_name, second) == 1
    assert client.offset_for_timestamp(stream_name, as_datetime) == 1
    assert client.offset_for_timestamp(stream_name, iso) == 1
    assert client.offset_for_timestamp(stream_name, 0) == 0
    assert client.offset_for_timestamp(stream_name, second + 60_000) == 2


def test_end_offsets_named_streams_and_pattern(client, stream_name):
    a, b = f"{stream_name}-a", f"{stream_name}-b"
    client.publish_batch(a, [{"value": "1"}, {"value": "2"}])
    client.publish(b, "1")
    client.delete_messages(a, before_offset=1)
    assert client.end_offsets([a, b]) == {a: (1, 2), b: (0, 1)}
    assert client.end_offsets(pattern=f"{stream_name}-*") == {a: (1, 2), b: (0, 1)}
    everything = client.end_offsets()
    assert everything[a] == (1, 2) and everything[b] == (0, 1)
    with pytest.raises(StreamNotFound):
        client.end_offsets([f"{stream_name}-missing"])

"""publish_batch over PublishStream: many requests in flight, offsets and errors as if sequential.

Requests are made small (64 KiB instead of ~4 MiB) so that a few MB of rows
cross dozens of requests; everything else is the SDK's defaults against a
real broker process.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from npstream import Client, InvalidArgument
from npstream.client.batching import row_sizes, split_rows
from npstream.errors import NpstreamError
from npstream.proto import pb

SMALL_REQUEST_BYTES = 64 << 10


@pytest.fixture
def small_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(split_rows, "__defaults__", (SMALL_REQUEST_BYTES,))


def _values(count: int, start: int = 0) -> list[bytes]:
    return [f"{i:010d}".encode() * 10 for i in range(start, start + count)]  # 100 B each


def _arrow_request(stream: str, values: list[bytes], ids: list[str] | None = None,
                   ack: int = pb.ACK_FSYNC) -> pb.PublishRequest:
    columns = {"value": pa.array(values, pa.binary())}
    if ids is not None:
        columns["id"] = pa.array(ids, pa.string())
    table = pa.table(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return pb.PublishRequest(stream=stream, arrow_stream=sink.getvalue().to_pybytes(), ack=ack)


def test_pipelined_publish_offsets_follow_input_order(client, stream_name, small_requests):
    client.publish(stream_name, "before")
    values = _values(30_000)  # ~3.4 MB: about 50 requests of 64 KiB
    result = client.publish_batch(stream_name, pa.table({"value": pa.array(values, pa.binary())}))
    assert result.offsets == list(range(1, 30_001))
    assert (result.first_offset, result.stored_count, result.duplicates) == (1, 30_000, [])
    back = pa.Table.from_batches(list(client.read_range(stream_name, 1, 30_001)))
    assert back.column("offset").to_pylist() == list(range(1, 30_001))
    assert back.column("value").to_pylist() == values
    assert client.stream_info(stream_name).end_offset == 30_001


def test_pipelined_publish_duplicates_across_requests_point_to_originals(
        client, stream_name, small_requests):
    client.create_stream(stream_name, dedup_window="10m")
    count = 20_000
    ids = [f"id-{i}" for i in range(count)]
    # The second half repeats the ids of the first half: different requests.
    ids[count // 2:] = ids[: count // 2]
    table = pa.table({"value": pa.array(_values(count), pa.binary()), "id": ids})
    result = client.publish_batch(stream_name, table)
    half = count // 2
    assert result.stored_count == half
    assert result.offsets == list(range(half)) + list(range(half))
    assert result.duplicates == [(half + i, i) for i in range(half)]
    assert client.stream_info(stream_name).end_offset == half
    # Sent again, every row is a duplicate of the stored copy.
    again = client.publish_batch(stream_name, table)
    assert (again.stored_count, again.first_offset) == (0, -1)
    assert again.offsets == result.offsets


def test_pipelined_publish_error_midway_reports_stored_rows_and_stores_no_later_request(
        client, stream_name, small_requests):
    client.create_stream(stream_name, max_message_bytes=1000)
    values = _values(20_000)
    values[12_345] = b"x" * 2000  # over the limit: its request is rejected
    with pytest.raises(InvalidArgument) as err:
        client.publish_batch(stream_name, pa.table({"value": pa.array(values, pa.binary())}))
    (note,) = err.value.__notes__
    stored = client.stream_info(stream_name).end_offset
    # Whole requests before the bad one were stored, nothing from it on, even
    # though later requests were already on the wire.
    assert 0 < stored <= 12_345
    assert note == (f"rows 0..{stored - 1} of this batch were stored before the error "
                    f"(offsets 0..{stored - 1}); rows from {stored} on were not")
    assert "is 2000 bytes" in str(err.value)
    back = pa.Table.from_batches(list(client.read_range(stream_name, 0, stored)))
    assert back.column("value").to_pylist() == values[:stored]


def test_publish_stream_rpc_replies_in_order_one_per_request(client, stream_name):
    other = f"{stream_name}-b"
    requests = [
        _arrow_request(stream_name, _values(3)),
        _arrow_request(other, _values(2), ack=pb.ACK_WRITE),
        pb.PublishRequest(stream=stream_name),  # empty: stores nothing, still answered
        pb.PublishRequest(stream=stream_name,
                          messages=[pb.Message(value=b"m1"), pb.Message(value=b"m2")]),
        _arrow_request(stream_name, _values(4, start=3)),
    ]
    responses = list(client.stream("StreamService.PublishStream", iter(requests), timeout=30))
    assert [(r.first_offset, r.stored_count) for r in responses] == [
        (0, 3), (0, 2), (3, 0), (3, 2), (5, 4)]
    values = client.fetch(stream_name, 0).column("value").to_pylist()
    assert values == [*_values(3), b"m1", b"m2", *_values(4, start=3)]
    assert client.fetch(other, 0).column("value").to_pylist() == _values(2)


def test_publish_stream_rpc_failed_request_ends_call_after_earlier_replies(client, stream_name):
    client.create_stream(stream_name, max_message_bytes=500)
    requests = [
        _arrow_request(stream_name, _values(2)),
        _arrow_request(stream_name, [b"y" * 600]),
        _arrow_request(stream_name, _values(5)),
    ]
    call = client.stream("StreamService.PublishStream", iter(requests), timeout=30)
    first = next(call)
    assert (first.first_offset, first.stored_count) == (0, 2)
    with pytest.raises(InvalidArgument, match=r"message 0 for stream .* is 600 bytes"):
        next(call)
    assert client.stream_info(stream_name).end_offset == 2


def test_pipelined_fsync_publish_survives_kill_9(broker_factory, small_requests):
    broker = broker_factory()
    values = _values(20_000)
    with Client(broker.address) as client:
        result = client.publish_batch("durable", pa.table({"value": pa.array(values,
                                                                             pa.binary())}))
        assert result.stored_count == 20_000
    broker.restart(hard=True)  # kill -9, no flush, then start on the same data dir
    with Client(broker.address) as client:
        assert client.stream_info("durable").end_offset == 20_000
        back = pa.Table.from_batches(list(client.read_range("durable", 0, 20_000)))
        assert back.column("value").to_pylist() == values


def test_pipelined_publish_to_missing_stream_without_auto_create_stores_nothing(
        broker_factory, small_requests):
    broker = broker_factory(env={"NPSTREAM_AUTO_CREATE_STREAMS": "false"})
    with Client(broker.address) as client, pytest.raises(NpstreamError, match="nope"):
        client.publish_batch("nope", pa.table({"value": pa.array(_values(5_000), pa.binary())}))


def test_publish_batch_of_a_generator_of_tables_keeps_input_order(client, stream_name):
    consumed: list[int] = []

    def tables():
        for part in range(6):
            consumed.append(part)
            yield pa.table({"value": pa.array(_values(40_000, start=part * 40_000),
                                              pa.binary())})  # ~4 MB: a request or two each

    result = client.publish_batch(stream_name, tables())
    assert consumed == list(range(6))
    assert (result.first_offset, result.stored_count) == (0, 240_000)
    assert result.offsets == list(range(240_000))
    back = pa.Table.from_batches(list(client.read_range(stream_name, 0, 240_000)))
    assert back.column("value").to_pylist() == _values(240_000)


def test_publish_batch_of_a_list_of_record_batches(client, stream_name):
    result = client.publish_batch(stream_name, [pa.record_batch({"value": [b"a", b"b"]}),
                                                pa.table({"value": ["c"], "id": ["i3"]})])
    assert result.offsets == [0, 1, 2]
    rows = client.fetch(stream_name, 0).to_pylist()
    assert [(r["value"], r["id"]) for r in rows][2] == (b"c", "i3")


def test_publish_batch_generator_bad_item_midway_keeps_earlier_rows_and_says_so(
        client, stream_name):
    def tables():
        yield pa.table({"value": pa.array(_values(1000), pa.binary())})
        yield {"value": b"not a table"}
        yield pa.table({"value": pa.array(_values(1000), pa.binary())})

    with pytest.raises(InvalidArgument, match="iterates pyarrow Tables or RecordBatches, "
                                              "got dict") as err:
        client.publish_batch(stream_name, tables())
    assert err.value.__notes__ == [
        "rows 0..999 of this batch were stored before the error (offsets 0..999); "
        "rows from 1000 on were not"]
    assert client.stream_info(stream_name).end_offset == 1000


def test_publish_batch_generator_rejected_request_stores_no_later_table(client, stream_name):
    client.create_stream(stream_name, max_message_bytes=1000)

    def tables():
        yield pa.table({"value": pa.array(_values(500), pa.binary())})
        yield pa.table({"value": pa.array([b"x" * 2000], pa.binary())})
        yield pa.table({"value": pa.array(_values(500), pa.binary())})

    with pytest.raises(InvalidArgument, match="is 2000 bytes") as err:
        client.publish_batch(stream_name, tables())
    assert err.value.__notes__ == [
        "rows 0..499 of this batch were stored before the error (offsets 0..499); "
        "rows from 500 on were not"]
    assert client.stream_info(stream_name).end_offset == 500


def test_publish_batch_generator_of_dicts_still_publishes_messages(client, stream_name):
    result = client.publish_batch(stream_name, ({"value": f"v{i}", "id": f"g{i}"}
                                                for i in range(3)))
    assert result.offsets == [0, 1, 2]
    assert client.fetch(stream_name, 0).column("id").to_pylist() == ["g0", "g1", "g2"]


def test_publish_stream_rpc_malformed_or_conflicting_request_is_invalid_argument(
        client, stream_name):
    truncated = pb.PublishRequest(stream=stream_name).SerializeToString() + b"\x1a\xff\xff\x7f"
    call = client._conn.stream_serialized("StreamService.PublishStream", iter([truncated]),
                                          pb.PublishResponse, timeout=30)
    with pytest.raises(InvalidArgument, match="malformed PublishRequest on PublishStream"):
        next(call)
    both = pb.PublishRequest(stream=stream_name, messages=[pb.Message(value=b"m")],
                             arrow_stream=b"not arrow")
    call = client.stream("StreamService.PublishStream", iter([both]), timeout=30)
    with pytest.raises(InvalidArgument, match="sets both messages and arrow_stream"):
        next(call)
    assert stream_name not in [s.name for s in client.list_streams(prefix=stream_name)]


# ---------------------------------------------------------------- fallbacks to unary Publish
# Real broker processes made to act as an older broker (no PublishStream) or to die in the
# middle of a PublishStream call, through the test-only hooks of npstream.broker.faults.


def _read_all(client: Client, stream: str) -> pa.Table:
    end = client.stream_info(stream).end_offset
    return pa.Table.from_batches(list(client.read_range(stream, 0, end)))


def test_publish_batch_falls_back_to_unary_on_a_broker_without_publish_stream(
        broker_factory, small_requests):
    from npstream.broker.faults import HIDE_RPCS_ENV

    broker = broker_factory(env={HIDE_RPCS_ENV: "StreamService.PublishStream"})
    values = _values(20_000)
    with Client(broker.address) as client:
        call = client._open_publish_stream("old", iter([_arrow_request(
            "old", [b"x"]).SerializeToString()]), timeout=10)
        with pytest.raises(NpstreamError) as refused:
            list(call)
        assert refused.value.code.name == "UNIMPLEMENTED"

        # An iterator of tables cannot be resent with unary calls: a clear error, nothing stored.
        tables = (pa.table({"value": pa.array(values[i:i + 5_000], pa.binary())})
                  for i in range(0, 20_000, 5_000))
        with pytest.raises(NpstreamError, match=(
                rf"the broker at {broker.address} has no StreamService.PublishStream .*"
                r"nothing was stored: pass one Table")) as old_broker:
            client.publish_batch("old", tables)
        assert old_broker.value.code.name == "UNIMPLEMENTED"
        assert client.list_streams() == []  # nothing stored, not even an auto-created stream

        result = client.publish_batch("old", pa.table({"value": pa.array(values, pa.binary())}))
        assert (result.first_offset, result.stored_count) == (0, 20_000)
        assert result.offsets == list(range(20_000))
        back = _read_all(client, "old")
        assert back.column("offset").to_pylist() == list(range(20_000))
        assert back.column("value").to_pylist() == values


def test_publish_batch_with_ids_resumes_unary_after_the_broker_dies_mid_stream(
        broker_factory, small_requests):
    """The broker dies after writing request 5 (rows in the page cache, no reply): the
    client resends from that request with unary calls once the broker is back, and the ids
    make the resent rows that were already stored duplicates: every row once, in order."""
    import threading

    from npstream.broker.faults import FAULT_EXIT_CODE, PUBLISH_FAULT_ENV

    broker = broker_factory(env={PUBLISH_FAULT_ENV: "exit_after_write:5"})
    values = _values(20_000)
    ids = [f"row-{i}" for i in range(20_000)]
    table = pa.table({"value": pa.array(values, pa.binary()), "id": pa.array(ids, pa.string())})
    assert len(split_rows(row_sizes(table))) > 8  # the fault hits the middle of the call

    def restart_when_dead() -> None:
        assert broker.proc.wait(60) == FAULT_EXIT_CODE
        broker.extra_env.pop(PUBLISH_FAULT_ENV)
        broker.start()

    restarter = threading.Thread(target=restart_when_dead)
    restarter.start()
    try:
        with Client(broker.address, retry_deadline=60.0) as client:
            result = client.publish_batch("resumed", table)
    finally:
        restarter.join(90)
    assert "exiting after writing PublishStream request 5" in broker.log_text()
    assert result.duplicates  # request 5 was stored before the crash and sent again
    assert result.stored_count + len(result.duplicates) == 20_000
    assert result.offsets == list(range(20_000))
    with Client(broker.address) as client:
        back = _read_all(client, "resumed")
    assert back.column("id").to_pylist() == ids
    assert back.column("value").to_pylist() == values

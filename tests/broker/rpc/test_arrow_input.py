"""Compressed Arrow IPC streams are bounded by what they decode to (issue 34 item 4).

A zstd-compressed IPC stream of ~35 KB decoded to 1 GiB and was stored; the
broker's memory grew by gigabytes per request. Now every path that decodes a
client's Arrow data (Publish, PublishStream, PublishMany, sink Stage) reads
the decoded size from the stream's metadata first and refuses one over the
request limit (grpc_max_message_bytes) with INVALID_ARGUMENT, nothing decoded
or stored, and counts what it decodes to in the publish memory budget.
"""

from __future__ import annotations

from contextlib import ExitStack

import grpc
import pyarrow as pa
import pytest

from harness import BrokerProcess
from npstream import Client
from npstream.broker.errors import InvalidArgumentError, OverloadedError
from npstream.broker.rpc.arrow_input import decode_arrow_stream
from npstream.broker.rpc.budget import PublishBudget
from npstream.proto import pb

MIB = 1 << 20
STREAM = "zipped"
# 256 MiB of zeros in 512 KiB values (each under the default max_message_bytes of 1 MiB):
# ~300 KB with zstd, four times the broker's 64 MiB request limit.
BOMB_ROWS, BOMB_VALUE = 512, 512 << 10
# The broker's memory may grow this much while refusing the four bombs (it grew by
# more than the decoded 256 MiB per request before).
RSS_GROWTH_BOUND = 64 * MIB


def _ipc(table: pa.Table, compression: str | None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _bomb(compression: str = "zstd") -> bytes:
    zeros = pa.array([b"\0" * BOMB_VALUE] * BOMB_ROWS, pa.binary())
    return _ipc(pa.table({"value": zeros}), compression)


def _requests(data: bytes) -> dict[str, tuple[str, bytes]]:
    """One request per path that decodes client Arrow: (method path, wire bytes)."""
    publish = pb.PublishRequest(stream=STREAM, arrow_stream=data)
    return {
        "Publish": ("/npstream.v1.StreamService/Publish", publish.SerializeToString()),
        "PublishStream": ("/npstream.v1.StreamService/PublishStream",
                          publish.SerializeToString()),
        "PublishMany": ("/npstream.v1.StreamService/PublishMany", pb.PublishManyRequest(
            entries=[publish]).SerializeToString()),
        "Stage": ("/npstream.v1.SinkService/Stage", pb.StageRequest(
            sink_id="zipped-sink", batch_id=0, staging_id="s-0", stream=STREAM,
            arrow_stream=data).SerializeToString()),
    }


def _send(channel: grpc.Channel, method: str, path: str, raw: bytes) -> tuple[str, str]:
    """(status name, details) of one call; a PublishMany entry's own error when it has one."""
    try:
        if method == "PublishStream":
            list(channel.stream_stream(path)(iter([raw]), timeout=60))
        else:
            reply = channel.unary_unary(path)(raw, timeout=60)
            if method == "PublishMany":
                result = pb.PublishManyResponse.FromString(reply).results[0]
                if result.HasField("error"):
                    code = next(c for c in grpc.StatusCode if c.value[0] == result.error.code)
                    return code.name, result.error.message
    except grpc.RpcError as exc:
        return exc.code().name, exc.details() or ""
    return "OK", ""


def test_publish_and_stage_of_a_compressed_bomb_are_refused_before_decoding(
        broker: BrokerProcess) -> None:
    data = _bomb()
    assert len(data) < 1 * MIB
    with Client(broker.address) as client:
        client.create_stream(STREAM, exist_ok=True)
        end = client.stream_info(STREAM).end_offset
    before = broker.rss()
    with grpc.insecure_channel(broker.address) as channel:
        outcomes = {method: _send(channel, method, path, raw)
                    for method, (path, raw) in _requests(data).items()}
    growth = broker.rss() - before
    for method, (code, details) in outcomes.items():
        assert code == "INVALID_ARGUMENT", (method, code, details)
        decoded = BOMB_ROWS * BOMB_VALUE + 4 * (BOMB_ROWS + 1)  # values and int32 offsets
        assert f"decodes to {decoded} bytes" in details, details
        assert "over the broker's limit of 67108864 bytes per request" in details, details
    assert growth < RSS_GROWTH_BOUND, f"the broker grew by {growth / MIB:.0f} MiB"
    with Client(broker.address) as client:
        assert client.stream_info(STREAM).end_offset == end
        assert client.sink(local_staging=False).abort("zipped-sink", 0) == 0  # nothing staged


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_publish_of_a_compressed_stream_within_the_limit_is_stored(
        broker: BrokerProcess, compression: str) -> None:
    values = [f"value-{i}".encode() * 100 for i in range(50)]
    data = _ipc(pa.table({"value": values}), compression)
    with Client(broker.address) as client:
        client.create_stream(STREAM, exist_ok=True)
        end = client.stream_info(STREAM).end_offset
        with grpc.insecure_channel(broker.address) as channel:
            for method, (path, raw) in _requests(data).items():
                if method != "Stage":
                    assert _send(channel, method, path, raw) == ("OK", ""), method
        stored = client.fetch(STREAM, end, end_offset=end + 3 * len(values))
        assert client.stream_info(STREAM).end_offset == end + 3 * len(values)
    assert stored.column("value").to_pylist() == values * 3


def test_decoded_bytes_beyond_the_wire_bytes_are_counted_in_the_publish_budget() -> None:
    budget = PublishBudget(8 * MIB)
    zeros = pa.array([b"\0" * MIB] * 6, pa.binary())  # decodes to ~6 MiB, sent as a few KB
    data = _ipc(pa.table({"value": zeros}), "zstd")
    with ExitStack() as room:
        table = decode_arrow_stream(data, "arrow_stream for stream 'z'", limit=64 * MIB,
                                    budget=budget, held=0, room=room)
        assert table.num_rows == 6
        assert budget.in_flight > 6 * MIB - len(data)
    assert budget.in_flight == 0
    budget.acquire(4 * MIB, "another publish", wait_s=0)  # the budget is half used
    with pytest.raises(OverloadedError, match="arrow_stream for stream 'z'"), ExitStack() as room:
        decode_arrow_stream(data, "arrow_stream for stream 'z'", limit=64 * MIB,
                            budget=budget, held=0, room=room)
    with pytest.raises(InvalidArgumentError, match=r"decodes to \d+ bytes .* over the broker's "
                       r"limit of 1048576 bytes"), ExitStack() as room:
        decode_arrow_stream(data, "arrow_stream for stream 'z'", limit=MIB,
                            budget=budget, held=0, room=room)
    budget.release(4 * MIB)

"""SinkService against a real broker process: staging, atomic commits, replays, aborts, GC."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from npstream import Client
from npstream.errors import InvalidArgument, StreamNotFound
from npstream.proto import pb
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.sink.client import (
    SinkClient,
    SinkConflict,
    encode_arrow_stream,
    encode_stage_request,
)


def rows(client: Client, stream: str, start: int = 0) -> pa.Table:
    end = client.stream_info(stream).end_offset
    return pa.Table.from_batches(list(client.read_range(stream, start, end)),
                                 schema=MESSAGE_SCHEMA)


def values(client: Client, stream: str, start: int = 0) -> list[bytes]:
    return rows(client, stream, start).column("value").to_pylist()


def staging_files(broker, sink_id: str) -> list[str]:
    root = Path(broker.data_dir) / "sink" / sink_id
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.arrow")) if root.exists() else []


@pytest.fixture
def sink(client: Client) -> SinkClient:
    return client.sink()


def test_commit_staged_rows_become_visible_at_once_with_contiguous_offsets(
        broker, client, sink, stream_name):
    client.publish_batch(stream_name, [{"value": b"before-0"}, {"value": b"before-1"}])
    first = sink.stage("s-visible", 0, "0-0-0", stream_name,
                       pa.table({"value": ["a", "b", "c"], "id": ["ia", None, "ic"]}))
    sink.stage("s-visible", 0, "0-1-0", stream_name, pa.table({"value": [b"d", b"e"]}))
    assert (first.rows, first.bytes > 0) == (3, True)
    assert client.stream_info(stream_name).end_offset == 2  # staged data is invisible

    result = sink.commit("s-visible", 0, ["0-0-0", "0-1-0"])

    assert result.already_committed is False
    assert result.written == {stream_name: (2, 7)}
    table = rows(client, stream_name, 2)
    assert table.column("offset").to_pylist() == [2, 3, 4, 5, 6]
    assert table.column("value").to_pylist() == [b"a", b"b", b"c", b"d", b"e"]
    ids = table.column("id").to_pylist()
    assert (ids[0], ids[2]) == ("ia", "ic")
    assert len({ids[1], ids[3], ids[4]}) == 3  # rows staged without an id get the broker's
    assert all(len(generated) == 32 for generated in (ids[1], ids[3], ids[4]))
    assert sink.last_batch_id("s-visible") == 0
    assert staging_files(broker, "s-visible") == []


def test_commit_replayed_or_older_batch_id_appends_nothing(client, sink, stream_name):
    sink.stage("s-replay", 4, "4-0", stream_name, pa.table({"value": ["x", "y"]}))
    assert sink.commit("s-replay", 4, ["4-0"]).written == {stream_name: (0, 2)}

    replay = sink.commit("s-replay", 4, ["4-0"])
    older = sink.commit("s-replay", 3, [])

    assert (replay.already_committed, replay.written) == (True, {})
    assert (older.already_committed, older.written) == (True, {})
    assert values(client, stream_name) == [b"x", b"y"]
    assert sink.last_batch_id("s-replay") == 4


def test_stage_for_already_committed_batch_is_accepted_and_discarded(broker, client, sink,
                                                                     stream_name):
    sink.stage("s-restage", 0, "0-0-a", stream_name, pa.table({"value": ["x"]}))
    sink.commit("s-restage", 0, ["0-0-a"])

    again = sink.stage("s-restage", 0, "0-0-b", stream_name, pa.table({"value": ["x"]}))

    assert (again.rows, again.bytes) == (1, 0)
    assert staging_files(broker, "s-restage") == []
    assert sink.commit("s-restage", 0, ["0-0-b"]).already_committed is True
    assert values(client, stream_name) == [b"x"]


def test_commit_appends_only_listed_stagings_and_drops_the_rest(broker, client, sink,
                                                                stream_name):
    sink.stage("s-listed", 0, "0-0-attempt0", stream_name, pa.table({"value": ["failed"]}))
    sink.stage("s-listed", 0, "0-0-attempt1", stream_name, pa.table({"value": ["retried"]}))
    sink.stage("s-listed", 1, "1-0-early", stream_name, pa.table({"value": ["next"]}))

    sink.commit("s-listed", 0, ["0-0-attempt1"])

    assert values(client, stream_name) == [b"retried"]
    assert staging_files(broker, "s-listed") == ["1/1-0-early.arrow"]


def test_stage_resent_staging_id_replaces_the_earlier_rows(client, sink, stream_name):
    sink.stage("s-resend", 0, "0-0", stream_name, pa.table({"value": ["one", "two"]}))
    sink.stage("s-resend", 0, "0-0", stream_name, pa.table({"value": ["three"]}))
    sink.commit("s-resend", 0, ["0-0"])
    assert values(client, stream_name) == [b"three"]


def test_commit_routes_rows_by_stream_column_atomically_per_stream(client, sink, stream_name):
    a, b = f"{stream_name}-a", f"{stream_name}-b"
    data = pa.table({"value": ["1", "2", "3", "4", "5"],
                     "stream": [a, b, None, a, b]})
    sink.stage("s-route", 0, "0-0", a, data)

    result = sink.commit("s-route", 0, ["0-0"])

    assert result.written == {a: (0, 3), b: (0, 2)}
    assert values(client, a) == [b"1", b"3", b"4"]
    assert values(client, b) == [b"2", b"5"]


def test_stage_bad_row_is_rejected_and_nothing_is_staged(broker, client, sink, stream_name):
    client.create_stream(stream_name, max_message_bytes=4)
    data = pa.table({"value": ["ok", "toolarge"], "stream": [stream_name, stream_name]})

    with pytest.raises(InvalidArgument, match=rf"row 1 for stream '{stream_name}' is 8 bytes, "
                                              r"over the stream's max_message_bytes=4"):
        sink.stage("s-bad", 0, "0-0", None, data)
    with pytest.raises(InvalidArgument, match=r"row 0: invalid stream name 'a/b'"):
        sink.stage("s-bad", 0, "0-0", None, pa.table({"value": ["x"], "stream": ["a/b"]}))
    with pytest.raises(InvalidArgument, match=r"invalid sink_id '\.\./x'"):
        sink.stage("../x", 0, "0-0", stream_name, pa.table({"value": ["x"]}))
    with pytest.raises(InvalidArgument, match=r"row 0 has no target stream"):
        sink.stage("s-bad", 0, "0-0", None, pa.table({"value": ["x"], "stream": [None]},
                                                    schema=pa.schema([("value", pa.string()),
                                                                      ("stream", pa.string())])))

    assert staging_files(broker, "s-bad") == []
    with pytest.raises(SinkConflict, match=r"staging '0-0' not found .* nothing was appended"):
        sink.commit("s-bad", 0, ["0-0"])
    assert client.stream_info(stream_name).end_offset == 0


def test_commit_to_missing_stream_with_auto_create_creates_it(client, sink, stream_name):
    sink.stage("s-create", 0, "0-0", stream_name, pa.table({"value": ["x"]}))
    with pytest.raises(StreamNotFound):
        client.stream_info(stream_name)
    sink.commit("s-create", 0, ["0-0"])
    assert client.stream_info(stream_name).end_offset == 1


def test_abort_drops_staging_and_a_later_commit_of_it_fails(broker, client, sink, stream_name):
    sink.stage("s-abort", 2, "2-0", stream_name, pa.table({"value": ["x"]}))
    sink.stage("s-abort", 2, "2-1", stream_name, pa.table({"value": ["y"]}))
    sink.stage("s-abort", 3, "3-0", stream_name, pa.table({"value": ["z"]}))

    assert sink.abort("s-abort", 2, ["2-1"]) == 1
    assert sink.abort("s-abort", 2) == 1
    assert sink.abort("s-abort", 2) == 0

    assert staging_files(broker, "s-abort") == ["3/3-0.arrow"]
    with pytest.raises(SinkConflict, match=r"staging '2-0' not found"):
        sink.commit("s-abort", 2, ["2-0"])
    with pytest.raises(StreamNotFound):
        client.stream_info(stream_name)


def test_sink_state_of_unknown_sink_is_minus_one(client):
    reply = client.call("SinkService.SinkState", pb.SinkStateRequest(sink_id="never-used"))
    assert (reply.exists, reply.last_batch_id) == (False, -1)
    assert client.sink().last_batch_id("never-used") == -1


def test_commit_with_concurrent_publishes_keeps_sink_rows_contiguous(client, sink, stream_name):
    batch = pa.table({"value": pa.array([b"s" * 200] * 5000)})
    staging_ids = [f"0-{p}" for p in range(4)]
    for staging_id in staging_ids:
        sink.stage("s-concurrent", 0, staging_id, stream_name, batch)
    stop = threading.Event()
    published: list[int] = []

    def publish_loop() -> None:
        with Client(client.address) as other:
            while not stop.is_set():
                published.append(other.publish(stream_name, b"p", ack="write").offset)

    threads = [threading.Thread(target=publish_loop) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    result = sink.commit("s-concurrent", 0, staging_ids)
    time.sleep(0.1)
    stop.set()
    for thread in threads:
        thread.join()

    start, end = result.written[stream_name]
    assert end - start == 20_000
    table = rows(client, stream_name)
    sink_offsets = [o for o, v in zip(table.column("offset").to_pylist(),
                                      table.column("value").to_pylist(), strict=True)
                    if v != b"p"]
    assert sink_offsets == list(range(start, end))
    assert not set(published) & set(range(start, end))
    assert len(published) > 0


def test_delete_stream_drops_staging_that_targets_only_it(broker, client, sink, stream_name):
    other = f"{stream_name}-other"
    client.create_stream(stream_name)
    sink.stage("s-delete", 0, "0-only", stream_name, pa.table({"value": ["x"]}))
    sink.stage("s-delete", 0, "0-mixed", None,
               pa.table({"value": ["x", "y"], "stream": [stream_name, other]}))

    assert client.delete_stream(stream_name) is True

    assert staging_files(broker, "s-delete") == ["0/0-mixed.arrow"]


def test_stage_malformed_arrow_stream_is_invalid_argument(client):
    request = pb.StageRequest(sink_id="s-garbage", batch_id=0, staging_id="0-0", stream="x",
                              arrow_stream=b"not arrow at all")
    with pytest.raises(InvalidArgument, match=r"arrow_stream of sink 's-garbage' batch 0 staging "
                                              r"'0-0' is not a valid Arrow IPC stream"):
        client.call("SinkService.Stage", request)
    empty = pb.StageRequest(sink_id="s-garbage", batch_id=0, staging_id="0-0", stream="x")
    with pytest.raises(InvalidArgument, match=r"has an empty arrow_stream"):
        client.call("SinkService.Stage", empty)


def _mixed_table() -> pa.Table:
    """Rows using every staged column: ids, keys, headers, nulls, binary and text values."""
    headers = pa.array([[("h", b"1")], None, [], [("a", b""), ("b", b"2")]],
                       type=pa.map_(pa.string(), pa.binary()))
    return pa.table({"value": [b"v0", b"", b"v2" * 1000, b"v3"],
                     "id": ["i0", None, "i2", None],
                     "key": [b"k0", None, b"", b"k3"],
                     "headers": headers})


def test_stage_wire_bytes_are_what_protobuf_serializes():
    table = _mixed_table()
    plain = pb.StageRequest(sink_id="s", batch_id=3, staging_id="3-0", stream="orders",
                            arrow_stream=encode_arrow_stream(table))
    head = pb.StageRequest(sink_id="s", batch_id=3, staging_id="3-0", stream="orders")
    assert encode_stage_request(head, table) == plain.SerializeToString()


def test_stage_raw_client_and_plain_generated_request_commit_the_same_rows(
        client, sink, stream_name):
    raw_stream, plain_stream = f"{stream_name}-raw", f"{stream_name}-pln"  # same length
    table = _mixed_table()
    staged = sink.stage("s-raw", 0, "0-0", raw_stream, table)
    request = pb.StageRequest(sink_id="s-plain", batch_id=0, staging_id="0-0",
                              stream=plain_stream, arrow_stream=encode_arrow_stream(table))
    reply = client.call("SinkService.Stage", request)  # an older client: the generated stub
    assert (staged.rows, reply.staged_rows) == (4, 4)
    assert reply.staged_bytes == staged.bytes > 0  # the same staging file

    assert sink.commit("s-raw", 0, ["0-0"]).written == {raw_stream: (0, 4)}
    assert sink.commit("s-plain", 0, ["0-0"]).written == {plain_stream: (0, 4)}

    raw_rows, plain_rows = rows(client, raw_stream), rows(client, plain_stream)
    for column in ("value", "key", "headers"):
        assert raw_rows.column(column).to_pylist() == table.column(column).to_pylist()
        assert plain_rows.column(column).to_pylist() == table.column(column).to_pylist()
    for ids in (raw_rows.column("id").to_pylist(), plain_rows.column("id").to_pylist()):
        assert (ids[0], ids[2]) == ("i0", "i2")
        assert len(ids[1]) == len(ids[3]) == 32  # assigned by the broker


@pytest.mark.parametrize(("raw", "detail"), [
    (b"\x0a\xff", "truncated or overlong varint"),
    (pb.StageRequest(sink_id="s-wire", staging_id="0-0").SerializeToString()
     + b"\x2a\xff\xff\x7f" + b"arrow", "field arrow_stream runs past the end"),
    (b"\x0b", "unsupported wire type 3"),
], ids=["bad-varint", "truncated-arrow", "group"])
def test_stage_malformed_wire_bytes_is_invalid_argument(broker, client, raw, detail):
    with pytest.raises(InvalidArgument, match=rf"malformed StageRequest: {detail}"):
        client.call_serialized("SinkService.Stage", raw, pb.StageResponse)
    assert staging_files(broker, "s-wire") == []


def test_commit_listing_a_staging_id_twice_is_invalid_argument(client, sink, stream_name):
    sink.stage("s-twice", 0, "0-0", stream_name, pa.table({"value": ["x"]}))
    with pytest.raises(InvalidArgument, match=r"lists a staging id twice"):
        sink.commit("s-twice", 0, ["0-0", "0-0"])


def test_sink_metrics_count_staged_and_committed_rows(broker, client, sink, stream_name):
    sink.stage("s-metrics", 0, "0-0", stream_name, pa.table({"value": ["a", "b", "c"]}))
    sink.commit("s-metrics", 0, ["0-0"])
    sink.commit("s-metrics", 0, ["0-0"])
    metrics = broker.metrics()
    assert metrics["npstream_sink_staged_rows_total"] >= 3
    assert metrics["npstream_sink_committed_rows_total"] >= 3
    assert metrics["npstream_sink_commits_total"] >= 1
    assert metrics["npstream_sink_replayed_commits_total"] >= 1


def test_stage_to_missing_stream_without_auto_create_is_not_found(broker_factory):
    proc = broker_factory("no-auto", env={"NPSTREAM_AUTO_CREATE_STREAMS": "false"})
    with Client(proc.address) as client:
        with pytest.raises(StreamNotFound, match=r"stream 'missing' does not exist"):
            client.sink().stage("s-noauto", 0, "0-0", "missing", pa.table({"value": ["x"]}))
        assert not (Path(proc.data_dir) / "sink" / "s-noauto").exists()


def test_commit_failing_midway_blocks_later_batches_until_retried(client, sink, stream_name):
    client.create_stream(stream_name, max_message_bytes=100)
    sink.stage("s-stuck", 0, "0-0", stream_name, pa.table({"value": ["x" * 50]}))
    sink.stage("s-stuck", 1, "1-0", stream_name, pa.table({"value": ["y"]}))
    client.update_stream(stream_name, max_message_bytes=10)  # after staging was checked

    with pytest.raises(InvalidArgument, match=r"over the stream's max_message_bytes=10"):
        sink.commit("s-stuck", 0, ["0-0"])
    with pytest.raises(SinkConflict, match=r"unfinished commit of batch 0; retry that commit "
                                           r"before committing batch 1"):
        sink.commit("s-stuck", 1, ["1-0"])
    with pytest.raises(SinkConflict, match=r"cannot abort sink 's-stuck' batch 0: its commit "
                                           r"has started"):
        sink.abort("s-stuck", 0)
    assert client.stream_info(stream_name).end_offset == 0

    client.update_stream(stream_name, max_message_bytes=100)
    assert sink.commit("s-stuck", 0, ["0-0"]).written == {stream_name: (0, 1)}
    assert sink.commit("s-stuck", 1, ["1-0"]).written == {stream_name: (1, 2)}
    assert values(client, stream_name) == [b"x" * 50, b"y"]


def test_commit_listing_staging_of_an_older_broker_is_refused_naming_its_format(
        broker, client, sink, stream_name):
    """An upgrade in the middle of a batch: a staging file in the Arrow IPC stream format of
    brokers before staged frames is refused, naming its format and the one this broker
    reads, logged once; nothing is appended, and the batch staged again commits."""
    sink.stage("s-upgrade", 0, "0-1", stream_name, pa.table({"value": ["new"], "id": ["n"]}))
    # What format 0 stored: the routed rows with their stream column, in one IPC stream.
    old = pa.table({"stream": [stream_name] * 2, "value": [b"old1", b"old2"],
                    "id": ["o1", None]})
    path = Path(broker.data_dir) / "sink" / "s-upgrade" / "0" / "0-0.arrow"
    with pa.OSFile(str(path), "wb") as out, pa.ipc.new_stream(out, old.schema) as writer:
        writer.write_table(old)

    refusal = (r"0-0.arrow is in staging format 0, written by an older broker; this broker "
               r"reads staging format 3 only")
    for _attempt in range(2):
        with pytest.raises(SinkConflict, match=refusal):
            sink.commit("s-upgrade", 0, ["0-0", "0-1"])
    with pytest.raises(StreamNotFound):  # refused before anything was created or appended
        client.stream_info(stream_name)
    assert broker.log_text().count("holds staging of an older broker") == 1

    sink.stage("s-upgrade", 0, "0-0", stream_name,
               pa.table({"value": ["old1", "old2"], "id": ["o1", None]}))
    assert sink.commit("s-upgrade", 0, ["0-0", "0-1"]).written == {stream_name: (0, 3)}
    table = rows(client, stream_name)
    assert table.column("value").to_pylist() == [b"old1", b"old2", b"new"]
    ids = table.column("id").to_pylist()
    assert (ids[0], ids[2], len(ids[1])) == ("o1", "n", 32)
    assert staging_files(broker, "s-upgrade") == []

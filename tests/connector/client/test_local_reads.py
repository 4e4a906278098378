"""Local reads against a real broker process: same rows as gRPC, and every reason to fall back."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from npstream import Client, StreamNeedsRepair
from npstream.client.local_reads import LocalReadUnavailable, LocalSpans, iter_local
from npstream.proto import pb


def _fill(client: Client, stream: str, count: int, per_call: int) -> None:
    for start in range(0, count, per_call):
        client.publish_batch(stream, pa.table({
            "value": pa.array([f"m{i}".encode() * 20 for i in range(start, start + per_call)],
                              pa.binary()),
            "id": pa.array([f"id-{i}" for i in range(start, start + per_call)]),
        }), ack="write")


@pytest.fixture(scope="module")
def small_segments(tmp_path_factory):
    """A broker whose segments roll every 16 KiB, so ranges cross many files."""
    from harness import BrokerProcess

    proc = BrokerProcess(tmp_path_factory.mktemp("local") / "data",
                         env={"NPSTREAM_SEGMENT_BYTES": "16KiB",
                              "NPSTREAM_INDEX_INTERVAL_BYTES": "1KiB"}).start()
    yield proc
    proc.stop()


def test_local_read_equals_grpc_read_across_segments_and_frame_edges(small_segments, stream_name):
    with Client(small_segments.address) as local, \
            Client(small_segments.address, local_reads=False) as remote:
        _fill(local, stream_name, 3000, 37)
        assert local.stream_info(stream_name).segment_count > 5
        for start, end in [(0, 3000), (5, 2999), (1234, 1235), (36, 38), (2000, 3000)]:
            mine = pa.Table.from_batches(list(local.read_range(stream_name, start, end)))
            theirs = pa.Table.from_batches(list(remote.read_range(stream_name, start, end)))
            assert mine.column("offset").to_pylist() == list(range(start, end))
            assert mine.equals(theirs)
        assert local._local_reads  # nothing made it give up


def test_locate_names_whole_frames_of_the_broker_files(small_segments, stream_name):
    with Client(small_segments.address) as client:
        _fill(client, stream_name, 500, 50)
        reply = client.call("StreamReadService.Locate",
                            pb.FetchRequest(stream=stream_name, offset=120, end_offset=480))
    assert reply.host_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert reply.next_offset == 480
    assert (reply.start_offset, reply.end_offset) == (0, 500)
    assert reply.spans
    for span in reply.spans:
        stat = os.stat(span.path)
        assert (stat.st_dev, stat.st_ino) == (span.device, span.inode)
        assert 0 <= span.position < span.end_position <= stat.st_size


def test_read_batches_honours_max_messages_and_end(small_segments, stream_name):
    with Client(small_segments.address) as client:
        _fill(client, stream_name, 300, 100)
        batches, next_offset = client.read_batches(stream_name, 10, end_offset=250,
                                                   max_messages=120)
        offsets = pa.Table.from_batches(batches).column("offset").to_pylist()
        assert offsets == list(range(10, 130))
        assert next_offset == 130


def test_broker_with_local_reads_off_serves_over_grpc(broker_factory, stream_name):
    proc = broker_factory(env={"NPSTREAM_LOCAL_READS": "false"})
    with Client(proc.address) as client:
        _fill(client, stream_name, 200, 50)
        reply = client.call("StreamReadService.Locate",
                            pb.FetchRequest(stream=stream_name, offset=0))
        assert (reply.host_id, list(reply.spans)) == ("", [])
        table = pa.Table.from_batches(list(client.read_range(stream_name, 0, 200)))
        assert table.column("offset").to_pylist() == list(range(200))
        assert not client._local_reads


def test_corrupt_frame_is_never_returned_locally_the_broker_reports_it(
        broker_factory, stream_name):
    proc = broker_factory()
    with Client(proc.address) as client:
        _fill(client, stream_name, 100, 50)
        reply = client.call("StreamReadService.Locate",
                            pb.FetchRequest(stream=stream_name, offset=0))
        path = reply.spans[0].path
        with open(path, "r+b") as f:  # flip a payload byte of the first frame
            f.seek(200)
            byte = f.read(1)
            f.seek(200)
            f.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(StreamNeedsRepair, match=stream_name):
            list(client.read_range(stream_name, 0, 100))


def _located(tmp_path: Path, **span: object) -> LocalSpans:
    from npstream.proto.host_identity import boot_id

    response = pb.LocateResponse(host_id=boot_id(), next_offset=10)
    response.spans.add(**span)
    return LocalSpans(response, 0)


def test_file_gone_since_locate_is_a_transient_fallback(tmp_path):
    located = _located(tmp_path, path=str(tmp_path / "gone.log"), position=0, end_position=64)
    with pytest.raises(LocalReadUnavailable) as err:
        list(iter_local(located))
    assert not err.value.permanent


def test_other_file_at_the_same_path_is_refused_for_good(tmp_path):
    other = tmp_path / "00000000000000000000.log"
    other.write_bytes(b"\0" * 64)
    stat = os.stat(other)
    located = _located(tmp_path, path=str(other), position=0, end_position=64,
                       device=stat.st_dev, inode=stat.st_ino + 1)
    with pytest.raises(LocalReadUnavailable, match="not the broker's file") as err:
        list(iter_local(located))
    assert err.value.permanent


def test_broker_on_another_machine_is_refused_for_good():
    response = pb.LocateResponse(host_id="another-kernel", next_offset=10)
    with pytest.raises(LocalReadUnavailable, match="another machine") as err:
        list(iter_local(LocalSpans(response, 0)))
    assert err.value.permanent

"""Stage by file: the client's inbox files, and Stage requests naming them on a real broker."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from npstream import Client
from npstream.errors import InvalidArgument
from npstream.proto import pb
from npstream.proto.host_identity import boot_id
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.sink import inbox as client_inbox
from npstream.sink.inbox import InboxUnavailable, StageInboxWriter, check_inbox


@pytest.fixture(autouse=True)
def fresh_writers():
    """Each test learns the broker's inbox anew (the registry is per process)."""
    def clear() -> None:
        for writer in client_inbox._writers.values():
            if writer is not None:
                writer.close()
        client_inbox._writers.clear()

    clear()
    yield
    clear()


def _table(count: int, size: int = 10) -> pa.Table:
    return pa.table({"value": [bytes([65 + i % 26]) * size for i in range(count)]})


def _ipc_rows(path: Path, length: int) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(path.read_bytes()[:length])).read_all()


def _inbox(broker) -> Path:
    return Path(broker.data_dir) / "stage-inbox"


def _our_files(broker) -> list[str]:
    return sorted(p.name for p in _inbox(broker).glob(f"*-{os.getpid()}-*.arrow"))


def _committed(client: Client, stream: str) -> list[bytes]:
    end = client.stream_info(stream).end_offset
    table = pa.Table.from_batches(list(client.read_range(stream, 0, end)), schema=MESSAGE_SCHEMA)
    return table.column("value").to_pylist()


# ---------------------------------------------------------------- without a broker


def _description(directory: Path, **changes: object) -> pb.StageInboxResponse:
    info = directory.stat()
    fields = {"host_id": boot_id(), "path": str(directory), "device": info.st_dev,
              "inode": info.st_ino, **changes}
    return pb.StageInboxResponse(**fields)


@pytest.mark.parametrize(("changes", "reason"), [
    ({"host_id": ""}, "the broker offers no stage inbox"),
    ({"host_id": "another-kernel"}, "the broker runs on another machine"),
    ({"inode": 1}, r"here is not the broker's inbox \(device/inode differ\)"),
    ({"path": "/nonexistent/stage-inbox"}, "cannot see the broker's inbox "
                                           "/nonexistent/stage-inbox: No such file"),
])
def test_check_inbox_refuses_a_directory_this_process_does_not_share(tmp_path, changes, reason):
    with pytest.raises(InboxUnavailable, match=reason):
        check_inbox(_description(tmp_path, **changes))
    assert check_inbox(_description(tmp_path)) == tmp_path


def test_writer_reuses_an_answered_file_and_deletes_any_other(tmp_path):
    writer = StageInboxWriter(tmp_path)
    first, length = writer.write(_table(3))
    assert _ipc_rows(tmp_path / first.name, length).equals(_table(3))
    writer.release(first, reusable=True)

    again, length = writer.write(_table(5))
    assert (again.name, again.inode) == (first.name, first.inode)
    assert _ipc_rows(tmp_path / again.name, length).equals(_table(5))
    writer.release(again, reusable=False)  # its request failed: the broker may still read it
    assert list(tmp_path.iterdir()) == []

    other, _ = writer.write(_table(1))
    assert other.name != first.name
    writer.release(other, reusable=True)
    writer.close()
    assert list(tmp_path.iterdir()) == []


def test_writer_grows_a_file_for_a_bigger_request_and_replaces_a_swept_one(tmp_path):
    writer = StageInboxWriter(tmp_path)
    small, _ = writer.write(_table(10))
    capacity = small.capacity
    writer.release(small, reusable=True)
    big_table = _table(3000, size=1000)  # ~3 MB: past the first 1 MiB step
    big, length = writer.write(big_table)
    assert big.name == small.name and big.capacity > capacity >= 1 << 20
    assert _ipc_rows(tmp_path / big.name, length).equals(big_table)
    writer.release(big, reusable=True)

    (tmp_path / big.name).unlink()  # what the broker's sweep does to an idle file
    fresh, length = writer.write(_table(2))
    assert fresh.name != big.name and (tmp_path / fresh.name).exists()
    assert _ipc_rows(tmp_path / fresh.name, length).equals(_table(2))
    writer.release(fresh, reusable=True)
    writer.close()


def test_writer_two_requests_at_once_get_two_files(tmp_path):
    writer = StageInboxWriter(tmp_path)
    one, _ = writer.write(_table(1))
    two, _ = writer.write(_table(2))
    assert one.name != two.name
    writer.release(one, reusable=True)
    writer.release(two, reusable=True)
    assert len(list(tmp_path.iterdir())) == 2
    writer.close()


# ---------------------------------------------------------------- against a real broker


def test_stage_hands_rows_over_in_one_reused_inbox_file(broker, client, stream_name):
    before = broker.metrics().get("npstream_sink_inbox_stages_total", 0)
    sink = client.sink()
    for part in range(3):
        result = sink.stage("s-file", 0, f"0-{part}", stream_name, _table(100 + part))
        assert result.rows == 100 + part
    assert len(_our_files(broker)) == 1  # answered requests give their file back
    assert sink.commit("s-file", 0, ["0-0", "0-1", "0-2"]).written == {stream_name: (0, 303)}

    expected = [*_table(100).column("value").to_pylist(), *_table(101).column("value").to_pylist(),
                *_table(102).column("value").to_pylist()]
    assert _committed(client, stream_name) == expected
    assert broker.metrics()["npstream_sink_inbox_stages_total"] == before + 3


def test_stage_with_local_staging_off_sends_the_rows_over_grpc(broker, client, stream_name):
    before = broker.metrics().get("npstream_sink_inbox_stages_total", 0)
    sink = client.sink(local_staging=False)
    sink.stage("s-grpc", 0, "0-0", stream_name, _table(4))
    sink.commit("s-grpc", 0, ["0-0"])
    assert _committed(client, stream_name) == _table(4).column("value").to_pylist()
    assert broker.metrics().get("npstream_sink_inbox_stages_total", 0) == before
    assert _our_files(broker) == []


def test_stage_bad_row_by_file_fails_like_grpc_and_deletes_the_file(broker, client, stream_name):
    client.create_stream(stream_name, max_message_bytes=100)
    with pytest.raises(InvalidArgument, match=rf"^row 1 for stream '{stream_name}' is 101 bytes, "
                       r"over the stream's max_message_bytes=100; nothing was staged$"):
        client.sink().stage("s-bad", 0, "0-0", stream_name,
                            pa.table({"value": [b"ok", b"x" * 101]}))
    assert _our_files(broker) == []
    assert not (Path(broker.data_dir) / "sink" / "s-bad").exists()


@pytest.mark.parametrize(("name", "inode", "reason"), [
    ("../sink/x.arrow", None, "'../sink/x.arrow' is not a file name of the stage inbox"),
    ("task.arrow", 1, "has inode .*, not 1: another file than the client's"),
    ("missing.arrow", None, "cannot open missing.arrow in .*: No such file"),
])
def test_stage_naming_an_unusable_file_is_refused_and_stages_nothing(
        broker, client, stream_name, name, inode, reason):
    target = _inbox(broker) / "task.arrow"
    target.write_bytes(b"\x00" * 64)
    request = pb.StageRequest(sink_id="s-refused", batch_id=0, staging_id="0-0",
                              stream=stream_name, inbox_file=name,
                              inbox_inode=inode or target.stat().st_ino, inbox_length=64)
    before = broker.metrics().get("npstream_sink_inbox_refused_total", 0)

    reply = client.call("SinkService.Stage", request)

    assert re.search(reason, reply.inbox_refused), reply.inbox_refused
    assert (reply.staged_rows, reply.staged_bytes) == (0, 0)
    assert not (Path(broker.data_dir) / "sink" / "s-refused").exists()
    assert broker.metrics()["npstream_sink_inbox_refused_total"] == before + 1
    target.unlink()


def test_a_refused_file_is_resent_over_grpc_and_staging_by_file_stops(
        broker, client, stream_name, monkeypatch, caplog):
    real_write = StageInboxWriter.write

    def write_then_swap(self, table):  # the file changes identity before the broker opens it
        file, length = real_write(self, table)
        file.inode += 1
        return file, length

    monkeypatch.setattr(StageInboxWriter, "write", write_then_swap)
    sink = client.sink()
    with caplog.at_level(logging.WARNING, logger="npstream.sink.inbox"):
        sink.stage("s-resent", 0, "0-0", stream_name, _table(6))
    sink.stage("s-resent", 0, "0-1", stream_name, _table(7))
    sink.commit("s-resent", 0, ["0-0", "0-1"])

    assert _committed(client, stream_name) == [*_table(6).column("value").to_pylist(),
                                               *_table(7).column("value").to_pylist()]
    assert re.search(r"Stage requests to 127\.0\.0\.1:\d+ carry their data over gRPC from now "
                     r"on: the broker refused .*\.arrow: .* another file", caplog.text)
    assert client_inbox._writers[(os.getpid(), client.address)] is None
    assert _our_files(broker) == []


def test_broker_without_an_inbox_gets_the_rows_over_grpc(broker_factory, stream_name):
    proc = broker_factory("no-inbox", env={"NPSTREAM_SINK_STAGE_INBOX": "false"})
    with Client(proc.address) as client:
        assert client.call("SinkService.StageInbox", pb.StageInboxRequest()).host_id == ""
        sink = client.sink()
        sink.stage("s-noinbox", 0, "0-0", stream_name, _table(3))
        sink.commit("s-noinbox", 0, ["0-0"])
        assert _committed(client, stream_name) == _table(3).column("value").to_pylist()
        refused = client.call("SinkService.Stage", pb.StageRequest(
            sink_id="s-noinbox", batch_id=1, staging_id="1-0", stream=stream_name,
            inbox_file="x.arrow", inbox_inode=1, inbox_length=1))
        assert refused.inbox_refused == ("this broker offers no stage inbox "
                                         "(sink_stage_inbox = false)")
    assert not (Path(proc.data_dir) / "stage-inbox").exists()
    assert client_inbox._writers[(os.getpid(), proc.address)] is None


# A program that forks and uses npstream in the child after the parent did turns
# gRPC's fork handlers back on (the package turns them off: connector/fork_safety.py),
# so the scenario runs in an interpreter started with GRPC_ENABLE_FORK_SUPPORT=true.
_FORKING_PROGRAM = """
import atexit, json, os, sys
from pathlib import Path
import pyarrow as pa
from npstream import Client

address, inbox, stream = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
def table(count):
    return pa.table({"value": [bytes([65 + i % 26]) * 10 for i in range(count)]})
def files_of(pid):
    return sorted(p.name for p in inbox.glob(f"*-{pid}-*.arrow"))

with Client(address) as client:
    sink = client.sink()
    sink.stage("s-fork", 0, "0-0", stream, table(2))
    parent_files = files_of(os.getpid())
    child = os.fork()
    if child == 0:  # the child: stage with a fresh client, then exit as a process does
        code = 4
        try:
            with Client(address) as own:
                own.sink().stage("s-fork", 0, "0-1", stream, table(3))
            code = 0 if len(files_of(os.getpid())) == 1 else 3
            atexit._run_exitfuncs()  # what a normal exit runs
        finally:
            os._exit(code)
    _pid, status = os.waitpid(child, 0)
    after_child = files_of(os.getpid())
    sink.stage("s-fork", 0, "0-2", stream, table(4))
    sink.commit("s-fork", 0, ["0-0", "0-1", "0-2"])
print(json.dumps({"child_exit": os.waitstatus_to_exitcode(status), "parent_files": parent_files,
                  "after_child": after_child, "child_left": files_of(child)}))
"""


def test_a_forked_child_stages_through_files_of_its_own_and_leaves_the_parents(
        broker, client, stream_name):
    env = {**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "true"}
    run = subprocess.run([sys.executable, "-c", _FORKING_PROGRAM, broker.address,
                          str(_inbox(broker)), stream_name],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["child_exit"] == 0
    assert len(result["parent_files"]) == 1
    assert result["after_child"] == result["parent_files"]  # the child's exit deleted none
    assert result["child_left"] == []  # and its own at exit
    assert _committed(client, stream_name) == [
        *_table(2).column("value").to_pylist(), *_table(3).column("value").to_pylist(),
        *_table(4).column("value").to_pylist()]

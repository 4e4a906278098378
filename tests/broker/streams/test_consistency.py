"""At start, the registry is checked against the data dir and every mismatch is said (issue 34).

Real broker processes on a data dir changed while they are stopped: the
metadata database deleted, a stream's last segment cut, the WAL damaged.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import struct
import time
from pathlib import Path

import pytest

from harness import BrokerProcess
from npstream import Client, StreamNeedsRepair
from npstream.broker.streams.consistency import wal_problem
from npstream.proto.frames.reader import FrameReader


def wait_for_check(broker: BrokerProcess, timeout: float = 30) -> str:
    """The broker's log once its data dir check has logged its summary (the log was
    emptied before the start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = broker.log_text()
        if "data dir check:" in text:
            return text
        time.sleep(0.05)
    raise AssertionError(f"no data dir check summary:\n{broker.log_text()[-3000:]}")


def frame_positions(path: Path) -> list[int]:
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = FrameReader(fd, 0, os.fstat(fd).st_size, read_size=1 << 20)
        positions = []
        while (frame := reader.next_frame()) is not None:
            positions.append(frame[0])
        return positions
    finally:
        os.close(fd)


def stopped_with_streams(broker_factory, damaged: str, count: int,
                         intact: str) -> BrokerProcess:
    """A broker stopped cleanly after ``count`` publishes to ``damaged`` and one to ``intact``."""
    broker = broker_factory()
    with Client(broker.address) as client:
        client.create_stream(damaged)
        client.create_stream(intact)
        for index in range(count):
            client.publish(damaged, f"m{index}".encode())
        client.publish(intact, b"w")
    broker.stop()
    return broker


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if " ERROR " in line]


def test_start_without_metadata_database_reports_every_orphaned_directory(broker_factory):
    broker = broker_factory()
    names = ["orders", "payments", "audit"]
    with Client(broker.address) as client:
        for name in names:
            client.create_stream(name)
            client.publish(name, b"a")
    broker.stop()
    for suffix in ("", "-wal", "-shm"):
        (broker.data_dir / f"meta.sqlite3{suffix}").unlink(missing_ok=True)
    broker.log_path.write_text("")
    broker.start()
    text = wait_for_check(broker)
    errors = error_lines(text)
    assert any(f"metadata database {broker.data_dir / 'meta.sqlite3'} was missing (an empty one "
               f"was made) while 3 stream directories exist" in line for line in errors), errors
    for name in names:
        assert any(f"stream '{name}': directory {broker.data_dir / 'streams' / name} has no row"
                   in line for line in errors), errors
    assert any("data dir check: 3 stream directories; mismatches: metadata 1, "
               "orphaned_directory 3, missing_directory 0, short_log 0" in line
               for line in errors), errors
    metrics = broker.metrics()
    assert metrics['npstream_data_dir_mismatches{kind="orphaned_directory"}'] == 3
    assert metrics['npstream_data_dir_mismatches{kind="metadata"}'] == 1


def test_start_with_tail_cut_at_frame_boundary_reports_and_refuses_the_stream(broker_factory):
    broker = stopped_with_streams(broker_factory, "cut", 200, "whole")
    segment = broker.data_dir / "streams" / "cut" / f"{0:020d}.log"
    positions = frame_positions(segment)
    assert len(positions) == 200
    os.truncate(segment, positions[150])
    broker.log_path.write_text("")
    broker.start()
    text = wait_for_check(broker)
    assert any(f"stream 'cut': its files in {segment.parent} hold less than recorded" in line
               and "the clean-shutdown marker records offsets up to 200" in line
               for line in error_lines(text)), error_lines(text)
    assert broker.metrics()['npstream_data_dir_mismatches{kind="short_log"}'] == 1
    with Client(broker.address) as client:
        info = client.stream_info("cut")
        assert info.error.startswith("stream 'cut' cannot be opened: corrupt record in")
        assert "offsets up to 200" in info.error
        # Nothing is damaged, something is missing: repair accepts the files, cuts nothing.
        assert info.error.endswith(
            "; run `npstream streams repair cut` to accept what the files hold (an incomplete "
            "last frame is cut; what is missing stays lost)"), info.error
        with pytest.raises(StreamNeedsRepair):
            client.publish("cut", b"would reuse offset 150")
        assert client.stream_info("whole").end_offset == 1
        repaired = client.repair_stream("cut")
        assert repaired.truncated_bytes == 0
        assert client.stream_info("cut").end_offset == 150
    assert segment.stat().st_size == positions[150]


def test_start_with_damaged_wal_frame_reports_metadata_mismatch(broker_factory):
    broker = broker_factory()
    with Client(broker.address) as client:
        for index in range(6):
            client.create_stream(f"s{index}")
            client.publish(f"s{index}", b"x")
    broker.kill()  # no checkpoint: the rows are in the WAL
    wal = broker.data_dir / "meta.sqlite3-wal"
    data = bytearray(wal.read_bytes())
    page_size = struct.unpack(">I", data[8:12])[0]
    assert len(data) >= 32 + 3 * (24 + page_size)
    data[32 + 24 + 100] ^= 0xFF  # the first frame's page
    wal.write_bytes(bytes(data))
    assert wal_problem(wal).startswith("damaged frame at byte 32 followed by a valid frame")
    broker.log_path.write_text("")
    broker.start()
    text = wait_for_check(broker)
    errors = error_lines(text)
    assert any(f"metadata WAL {wal}: damaged frame at byte 32" in line for line in errors), errors
    assert any("has no row in the metadata database" in line for line in errors), errors


def test_wal_problem_of_damaged_header_and_whole_wal(tmp_path):
    database = tmp_path / "db.sqlite3"
    connection = sqlite3.connect(database)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA wal_autocheckpoint=0")
    connection.execute("CREATE TABLE t (x)")
    connection.execute("INSERT INTO t VALUES (1)")
    connection.commit()
    wal = Path(f"{database}-wal")
    copy = tmp_path / "copy-wal"
    copy.write_bytes(wal.read_bytes())
    connection.close()
    assert wal_problem(copy) == ""
    data = bytearray(copy.read_bytes())
    data[13] ^= 1  # the checkpoint sequence, under the header checksum
    copy.write_bytes(bytes(data))
    assert wal_problem(copy) == "damaged header: SQLite ignores every transaction in it"
    assert wal_problem(tmp_path / "absent-wal") == ""


def test_start_with_unreadable_metadata_database_fails_naming_it(broker_factory):
    broker = broker_factory()
    with Client(broker.address) as client:
        client.create_stream("kept")
        client.publish("kept", b"x")
    broker.stop()
    database = broker.data_dir / "meta.sqlite3"
    database.write_bytes(b"not a database, " * 512)
    with pytest.raises(RuntimeError) as error:
        broker.start()
    assert (f"metadata database {database} is unreadable (file is not a database); restore "
            f"it from a backup (stream files are kept under {broker.data_dir / 'streams'})"
            in str(error.value))
    assert (broker.data_dir / "streams" / "kept").is_dir()


def test_restart_after_crash_with_length_flip_mid_tail_refuses_and_keeps_group_position(
        broker_factory):
    """Issue 34 item 1 as reported: 200 frames, kill -9, a bit of frame 100's payload
    length flipped; the stream is refused, the 99 frames after it stay, and the group's
    position stays at 200."""
    broker = broker_factory()
    with Client(broker.address) as client:
        client.create_stream("flipped")
        for index in range(200):
            client.publish("flipped", f"m{index}".encode())
        consumer = client.consumer("flipped", "readers")
        assert len(consumer.pull(limit=200)) == 200
    broker.kill()
    segment = broker.data_dir / "streams" / "flipped" / f"{0:020d}.log"
    position = frame_positions(segment)[100]
    data = bytearray(segment.read_bytes())
    data[position + 11] ^= 0x40  # payload_len bit 30: the frame seems to run past the end
    segment.write_bytes(bytes(data))
    broker.log_path.write_text("")
    broker.start()
    with Client(broker.address) as client:
        with pytest.raises(StreamNeedsRepair) as error:
            client.fetch("flipped", 0)
        assert f"corrupt record in {segment} at byte {position}" in str(error.value)
        assert f"an intact frame follows at byte {frame_positions_after(data, position)}" \
            in str(error.value)
        assert str(error.value).endswith(
            "; run `npstream streams repair flipped` to truncate the log there")
        with pytest.raises(StreamNeedsRepair):  # a group needs its stream's end
            client.describe_group("flipped", "readers")
    broker.stop()
    with sqlite3.connect(broker.data_dir / "meta.sqlite3") as database:
        assert database.execute(
            "SELECT committed_offset FROM consumer_groups WHERE stream = 'flipped' AND "
            "grp = 'readers'").fetchall() == [(200,)]
    assert segment.read_bytes() == bytes(data)  # nothing cut
    assert "torn tail" not in broker.log_text()
    assert any("stream 'flipped' needs repair" in line for line in error_lines(
        broker.log_text()))


def frame_positions_after(data: bytes | bytearray, position: int) -> int:
    """Where the frame after the one at ``position`` starts (its length read intact)."""
    return position + 48 + int.from_bytes(bytes(data[position + 8:position + 12]), "little") \
        - (0x40 << 24)


def read_extent(directory: Path) -> dict[str, int]:
    return json.loads((directory / "log-extent").read_text())


def test_open_after_crash_records_extent_only_after_fsync_of_the_tail(broker_factory):
    # log-extent is written without an fsync of its own; after a crash the tail may
    # hold ack="write" data never fsynced. If the record reached the disk before that
    # data, a power loss would leave a record above the files: the stream refused.
    # So the open fsyncs the tail first, and when that fsync fails the old record stays.
    broker = broker_factory()
    with Client(broker.address) as client:
        client.create_stream("s")
        client.publish("s", b"first", ack="fsync")
    broker.restart()
    directory = broker.data_dir / "streams" / "s"
    with Client(broker.address) as client:
        client.fetch("s", 0)  # the log opens and records its extent
        before = read_extent(directory)
        for index in range(50):
            client.publish("s", f"m{index}".encode(), ack="write")
    broker.kill()
    broker.extra_env["NPSTREAM_STORAGE_FAULT"] = "fsync:EIO:s"
    broker.log_path.write_text("")
    broker.start()
    with Client(broker.address) as client:
        assert client.stream_info("s").end_offset == 51
        assert len(client.fetch("s", 0, max_messages=100)) == 51
    assert read_extent(directory) == before  # the fsync failed: nothing above it recorded
    assert before["next_offset"] < 51
    assert "could not fsync" in broker.log_text() and "the old record stays" in broker.log_text()
    broker.stop()
    del broker.extra_env["NPSTREAM_STORAGE_FAULT"]
    broker.start()  # a clean stop (its close fsyncs): the next open records the whole log
    with Client(broker.address) as client:
        assert len(client.fetch("s", 0, max_messages=100)) == 51  # opens the log
    assert read_extent(directory)["next_offset"] == 51


def test_open_with_stream_directory_removed_refuses_then_repair_never_reuses_offsets(
        broker_factory):
    # The registry row alone remained: the stream reopened empty at offset 0 and the
    # next publish got offset 0 again. The row records the end reached at a clean stop.
    broker = stopped_with_streams(broker_factory, "gone", 20, "kept")
    directory = broker.data_dir / "streams" / "gone"
    shutil.rmtree(directory)
    broker.log_path.write_text("")
    broker.start()
    text = wait_for_check(broker)
    assert any(f"stream 'gone': its directory {directory} is missing" in line
               and "records offsets up to 20" in line for line in error_lines(text)), text
    assert broker.metrics()['npstream_data_dir_mismatches{kind="missing_directory"}'] == 1
    with Client(broker.address) as client:
        with pytest.raises(StreamNeedsRepair) as error:
            client.publish("gone", b"would reuse offset 0")
        message = str(error.value)
        assert f"corrupt record in {directory} at byte 0: the stream directory is missing" \
            in message and "records offsets up to 20" in message, message
        info = client.stream_info("gone")
        assert "the stream directory is missing" in info.error
        assert any("stream 'gone' needs repair" in line and str(directory) in line
                   and "offsets up to 20" in line for line in error_lines(broker.log_text()))
        assert client.stream_info("kept").end_offset == 1
        client.repair_stream("gone")
        info = client.stream_info("gone")
        assert (info.start_offset, info.end_offset) == (20, 20)
        assert client.publish("gone", b"after").offset == 20
        assert client.fetch("gone", 20)["offset"].to_pylist() == [20]
    assert any("repaired stream 'gone': its directory" in line and "restarts empty at offset 20"
               in line for line in broker.log_text().splitlines() if " WARNING " in line)
    broker.restart()
    with Client(broker.address) as client:
        assert client.stream_info("gone").end_offset == 21
        assert client.publish("gone", b"again").offset == 21

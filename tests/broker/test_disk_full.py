"""Disk full on a real small filesystem (issue 18): a size-limited tmpfs the test mounts.

The broker's data dir lives on a 16 MiB tmpfs; the test fills the rest of it
with a file, so every write the broker tries runs out of space for real
(ENOSPC from the kernel, SQLITE_FULL from SQLite), nothing mocked. What must
hold while the disk is full, and after space is freed:

* a publish (unary and pipelined) fails with RESOURCE_EXHAUSTED, reason
  DISK_FULL (client ``DiskFull``), naming the stream; nothing of it is stored;
* nothing already stored is damaged: every stream reads back the same, and
  its segment files walk frame by frame (CRC) with contiguous offsets;
* consumers keep reading (fetch, cursor pull, shared-group receive);
* a sink stage and commit (SinkClient) and a cursor-group commit fail the
  same way, promptly, instead of hanging or answering INTERNAL;
* once the filler is deleted, publishing, staging, committing and group
  commits work again, without a restart, and a commit lands exactly once;
* a kill -9 afterwards loses nothing that was acknowledged;
* with no byte free (a 32 MiB tmpfs), docs/broker.md's remedies free space:
  delete_messages before an offset, update_stream(max_bytes) then retention,
  delete_messages of a whole stream (issue 34 item 8, the disk reserve).

Mounting needs root (CAP_SYS_ADMIN); without it the tests skip saying so.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest
from integrity import check_files, check_streams, read_back

from harness import BrokerProcess
from npstream import Client, DiskFull
from npstream.broker.streams.disk_reserve import RESERVE_FILE
from npstream.broker.streams.tuning import RESERVE_BYTES

FS_SIZE = "16m"
STREAM = "orders"


@contextmanager
def mounted_tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``mount_point`` until the block ends (skips without root)."""
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                             str(mount_point)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs for the disk-full tests (needs root, "
                    f"CAP_SYS_ADMIN): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs mounted for this test, unmounted after it."""
    with mounted_tmpfs(tmp_path / "small-fs", FS_SIZE) as mount_point:
        yield mount_point


def start_broker(data_dir: Path, tmp_path: Path, **env: str) -> BrokerProcess:
    """A broker whose data dir is on the small filesystem (its log is not)."""
    proc = BrokerProcess(data_dir, env={
        # Small segments: rolls (index files, a new segment) happen near the full
        # point too. O_DIRECT is refused by tmpfs; the sink falls back by itself.
        "NPSTREAM_SEGMENT_BYTES": "256KiB", **env,
    })
    proc.log_path = tmp_path / "broker.log"
    proc.start()
    return proc


@pytest.fixture
def broker(small_fs: Path, tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = start_broker(small_fs / "data", tmp_path)
    yield proc
    proc.kill()


def fill(directory: Path, name: str = "filler") -> Path:
    """Write a file into ``directory`` until the filesystem has no byte left; returns it."""
    filler = directory / name
    with open(filler, "wb", buffering=0) as handle:
        for chunk in (1 << 20, 1 << 12, 1 << 9, 1):
            block = b"\0" * chunk
            try:
                while True:
                    handle.write(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    assert os.statvfs(directory).f_bavail == 0
    return filler


def rows(prefix: str, count: int, size: int = 1000) -> pa.Table:
    return pa.table({"value": [f"{prefix}-{i}-".encode().ljust(size, b"x") for i in range(count)],
                     "id": [f"{prefix}-{i}" for i in range(count)]})


def ids(client: Client, stream: str = STREAM) -> list[str]:
    return read_back(client, stream).column("id").to_pylist()


def assert_disk_full(exc: DiskFull, stream: str | None) -> None:
    assert exc.code is not None and exc.code.name == "RESOURCE_EXHAUSTED"
    assert "disk full" in str(exc)
    if stream is not None:
        assert f"stream '{stream}'" in str(exc), str(exc)


def test_publish_on_a_full_disk(broker: BrokerProcess, small_fs: Path) -> None:
    with Client(broker.address, retry_deadline=2) as client:
        client.create_stream(STREAM, max_bytes=0)
        client.publish_batch(STREAM, rows("before", 500))
        client.publish("other", b"lone", id="other-0")
        consumer = client.consumer(STREAM, "readers")
        assert len(consumer.pull(100)) == 100  # auto-commit: position 100
        assert len(client.receive(STREAM, "workers", 1)) == 1  # the group exists: a row
        before = ids(client)
        filler = fill(small_fs)

        # Every size of publish fails cleanly, unary and pipelined, and stores nothing.
        failures = 0
        for size, count in ((1000, 1), (1000, 50), (20_000, 20), (200_000, 3)):
            for publish in (lambda t: client.publish_batch(STREAM, t),
                            lambda t: client.publish(STREAM, t.column("value")[0].as_py(),
                                                     id=t.column("id")[0].as_py())):
                table = rows(f"full-{size}-{count}", count, size)
                try:
                    publish(table)
                except DiskFull as exc:
                    assert_disk_full(exc, STREAM)
                    failures += 1
        assert failures >= 6, "a full disk should refuse most publishes"
        stored_while_full = [i for i in ids(client) if i.startswith("full-")]
        assert ids(client) == before + stored_while_full  # appended whole or not at all

        # Readers go on: fetch, local reads, a cursor group's pull, a shared group.
        assert client.fetch(STREAM, 0, max_messages=10).column("id").to_pylist() == before[:10]
        assert len(consumer.pull(100, auto_commit=False)) == 100
        leases = client.receive(STREAM, "workers", 20)
        assert [lease.id for lease in leases] == before[1:21]
        assert client.fetch("other", 0).column("id").to_pylist() == ["other-0"]

        filler.unlink()
        result = client.publish_batch(STREAM, rows("after", 100))
        assert result.stored_count == 100
        assert ids(client) == before + stored_while_full + [f"after-{i}" for i in range(100)]
        assert not client.stream_info(STREAM).error
        stored = ids(client)
    broker.kill()
    check_files(broker.data_dir)
    broker.start()
    with Client(broker.address) as client:
        assert ids(client) == stored
        assert client.consumer(STREAM, "readers").position == 100
        check_streams(client)
    assert "unexpected error" not in broker.log_text(), broker.log_text()[-5000:]


def test_group_commit_on_a_full_disk(broker: BrokerProcess, small_fs: Path) -> None:
    """A cursor commit that cannot be written fails at once (it hung until the deadline)."""
    with Client(broker.address, retry_deadline=2, timeout=30) as client:
        client.publish_batch(STREAM, rows("m", 100))
        consumer = client.consumer(STREAM, "g")
        consumer.commit(next_offset=10)
        filler = fill(small_fs)
        refused = None
        committed = 10
        # SQLite writes into free room of its WAL until the WAL must grow.
        for attempt in range(2000):
            target = 11 + attempt % 80
            started = time.monotonic()
            try:
                consumer.commit(next_offset=target)
                committed = target
            except DiskFull as exc:
                assert time.monotonic() - started < 5, "a failed group commit must not hang"
                assert_disk_full(exc, STREAM)
                assert "group 'g'" in str(exc)
                refused = exc
                break
        assert refused is not None, "2000 group commits fit on a full disk"
        assert len(consumer.pull(5, auto_commit=False)) == 5  # reading goes on
        filler.unlink()
        assert consumer.commit(next_offset=95) == 95
    broker.kill()
    broker.start()
    with Client(broker.address) as client:
        assert client.consumer(STREAM, "g").position == 95
        check_streams(client)
    assert committed >= 10
    assert "unexpected error" not in broker.log_text(), broker.log_text()[-5000:]


def test_sink_stage_and_commit_on_a_full_disk(broker: BrokerProcess, small_fs: Path) -> None:
    with Client(broker.address, retry_deadline=2) as client:
        sink = client.sink(local_staging=False)
        client.create_stream(STREAM, max_bytes=0)
        sink.stage("job", 0, "0-a", STREAM, rows("b0", 200))
        sink.commit("job", 0, ["0-a"])
        sink.stage("job", 1, "1-a", STREAM, rows("b1", 300))
        sink.stage("job", 1, "1-b", "second", rows("b1-second", 10))
        before = ids(client)
        filler = fill(small_fs)

        with pytest.raises(DiskFull) as staged:
            sink.stage("job", 2, "2-a", STREAM, rows("b2", 300))
        assert_disk_full(staged.value, STREAM)
        with pytest.raises(DiskFull) as committed:
            sink.commit("job", 1, ["1-a", "1-b"])
        assert_disk_full(committed.value, STREAM)
        assert "commit of sink 'job' batch 1" in str(committed.value)
        assert ids(client) == before  # nothing of batch 1 is visible
        assert sink.last_batch_id("job") == 0
        assert client.fetch(STREAM, 0, max_messages=5).num_rows == 5

        filler.unlink()
        result = sink.commit("job", 1, ["1-a", "1-b"])  # the same commit, retried
        assert not result.already_committed
        assert sink.commit("job", 1, ["1-a", "1-b"]).already_committed
        sink.stage("job", 2, "2-a", STREAM, rows("b2", 300))
        sink.commit("job", 2, ["2-a"])
        expected = (before + [f"b1-{i}" for i in range(300)] + [f"b2-{i}" for i in range(300)])
        assert ids(client) == expected
        assert ids(client, "second") == [f"b1-second-{i}" for i in range(10)]
    broker.kill()
    check_files(broker.data_dir)
    broker.start()
    with Client(broker.address) as client:
        assert ids(client) == expected
        assert client.sink().last_batch_id("job") == 2
        check_streams(client)
    assert "unexpected error" not in broker.log_text(), broker.log_text()[-5000:]


def free_bytes(directory: Path) -> int:
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


def fill_past_the_reserve(fs: Path, name: str) -> None:
    """Take every byte left, once the broker holds its disk reserve again (it takes it
    back when twice its size is free; a broker without one is filled after 15 s)."""
    reserve = fs / "data" / RESERVE_FILE
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not (
            reserve.exists() and reserve.stat().st_size == RESERVE_BYTES):
        time.sleep(0.05)
    fill(fs, name)


def test_deleting_at_zero_bytes_free_frees_space(tmp_path: Path) -> None:
    """Issue 34 item 8: docs/broker.md's remedies for a full disk work with no byte free.

    A 32 MiB tmpfs holds three streams; before each remedy a filler takes the
    last free byte. Each remedy must succeed and free space: delete_messages
    before an offset, update_stream(max_bytes) then the retention pass, and
    delete_messages of a whole stream (whose messages also sit in its active
    segment). Afterwards publishing works again and a kill -9 keeps every
    deletion and every message that was kept.
    """
    with mounted_tmpfs(tmp_path / "fs-32m", "32m") as fs:
        broker = start_broker(fs / "data", tmp_path, NPSTREAM_RETENTION_CHECK_INTERVAL="200ms")
        try:
            with Client(broker.address, retry_deadline=2) as client:
                client.create_stream(STREAM, max_bytes=0)
                for part in range(16):  # 16 MB in 256 KiB segments
                    client.publish_batch(STREAM, rows(f"o{part}", 1000))
                client.create_stream("archive", max_bytes=0)
                client.publish_batch("archive", rows("a", 2000))
                client.create_stream("small", max_bytes=0)
                client.publish_batch("small", rows("s", 10))  # in its active segment only
                orders = ids(client)

                fill_past_the_reserve(fs, "filler-1")
                info = client.delete_messages(STREAM, 5000)
                assert (info.start_offset, info.end_offset) == (5000, 16_000)
                assert free_bytes(fs) >= 4 << 20, free_bytes(fs)  # ~5 MB of segments gone
                assert ids(client) == orders[5000:]

                fill_past_the_reserve(fs, "filler-2")
                info = client.update_stream(STREAM, max_bytes=2 << 20)
                assert info.config.max_bytes == 2 << 20
                # Retention deletes segments in passes; wait for the last one, and for the
                # space of the deleted files (closed by the file cache) to come back.
                deadline = time.monotonic() + 30
                while (client.stream_info(STREAM).start_offset < 16_000 - 2_200
                       or free_bytes(fs) < 7 << 20):
                    assert time.monotonic() < deadline, (
                        client.stream_info(STREAM).start_offset, free_bytes(fs))
                    time.sleep(0.1)
                start = client.stream_info(STREAM).start_offset
                assert start >= 16_000 - 2_200  # ~2 MiB of 1 KB messages left
                assert ids(client) == orders[start:]

                for name, end in (("archive", 2000), ("small", 10)):
                    fill_past_the_reserve(fs, f"filler-{name}")
                    info = client.delete_messages(name)
                    assert (info.start_offset, info.end_offset) == (end, end)
                assert free_bytes(fs) >= 1 << 20, free_bytes(fs)

                released = [line for line in broker.log_text().splitlines()
                            if "released the 1048576-byte disk reserve" in line]
                assert [line.split("so that ")[1] for line in released] == [
                    f"{action} of stream '{name}' can run" for action, name in (
                        ("delete_messages", STREAM), ("update_stream", STREAM),
                        ("delete_messages", "archive"), ("delete_messages", "small"))]
                for filler in fs.glob("filler-*"):
                    filler.unlink()
                assert client.publish_batch("small", rows("after", 5)).first_offset == 10
                assert client.publish_batch(STREAM, rows("after", 5)).first_offset == 16_000
            broker.kill()
            check_files(broker.data_dir)
            broker.start()
            with Client(broker.address) as client:
                assert [(s.name, s.start_offset, s.end_offset) for s in sorted(
                    client.list_streams(), key=lambda s: s.name)] == [
                    ("archive", 2000, 2000), (STREAM, start, 16_005), ("small", 10, 15)]
                assert ids(client) == orders[start:] + [f"after-{i}" for i in range(5)]
                check_streams(client)
        finally:
            broker.kill()

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
* a kill -9 afterwards loses nothing that was acknowledged.

Mounting needs root (CAP_SYS_ADMIN); without it the tests skip saying so.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from integrity import check_files, check_streams, read_back

from harness import BrokerProcess
from npstream import Client, DiskFull

FS_SIZE = "16m"
STREAM = "orders"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs mounted for this test, unmounted after it."""
    mount_point = tmp_path / "small-fs"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_SIZE}", "tmpfs",
                             str(mount_point)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a {FS_SIZE} tmpfs for the disk-full tests (needs root, "
                    f"CAP_SYS_ADMIN): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def broker(small_fs: Path, tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker whose data dir is on the small filesystem (its log is not)."""
    proc = BrokerProcess(small_fs / "data", env={
        # Small segments: rolls (index files, a new segment) happen near the full
        # point too. O_DIRECT is refused by tmpfs; the sink falls back by itself.
        "NPSTREAM_SEGMENT_BYTES": "256KiB",
    })
    proc.log_path = tmp_path / "broker.log"
    proc.start()
    yield proc
    proc.kill()


def fill(directory: Path) -> Path:
    """Write a file into ``directory`` until the filesystem has no byte left; returns it."""
    filler = directory / "filler"
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

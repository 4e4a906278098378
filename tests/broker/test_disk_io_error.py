"""A failing disk (EIO on fsync or write) fails the publish with INTERNAL, and nothing else.

The broker's own fault hook (``NPSTREAM_STORAGE_FAULT``, broker/faults.py)
makes one fsync or one write of one stream's files raise ``OSError(EIO)`` in
a real broker process, as a dying disk does. What must hold:

* the publish that needed it fails with INTERNAL (``BrokerInternalError``),
  reason INTERNAL, a message naming the stream and saying what to do; INTERNAL
  rather than UNAVAILABLE because retrying cannot help before a restart
  (broker/errors.py, ``DiskIOError``);
* after a failed fsync the stream refuses writes (the same error, at once)
  until the broker restarts, but still serves reads and groups; after a
  failed write whose undo worked nothing is stored and the stream takes
  writes again at once;
* other streams keep working, the process stays up;
* every acknowledged message is there, exactly once and in order, before
  and after a restart; after the restart the stream takes writes again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from integrity import check_files, read_back

from harness import BrokerProcess
from npstream import BrokerInternalError, Client
from npstream.proto import pb

FSYNC_BAD, WRITE_BAD, GOOD = "eio-fsync", "eio-write", "healthy"
# The 4th fsync of FSYNC_BAD's files and the 3rd frame write of WRITE_BAD's fail.
FAULTS = f"fsync:EIO:{FSYNC_BAD}:4,write:EIO:{WRITE_BAD}:3"


@pytest.fixture
def eio_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "data", env={"NPSTREAM_STORAGE_FAULT": FAULTS}).start()
    yield proc
    proc.kill()


def _batch(values: list[bytes]) -> list[dict[str, bytes]]:
    return [{"value": v} for v in values]


def _values(client: Client, stream: str) -> list[bytes]:
    return read_back(client, stream).column("value").to_pylist()


def test_a_failed_fsync_is_internal_for_that_stream_only(eio_broker: BrokerProcess) -> None:
    acked: list[bytes] = []
    with Client(eio_broker.address, retry_deadline=5) as client:
        for stream in (FSYNC_BAD, GOOD):
            client.create_stream(stream)
        with pytest.raises(BrokerInternalError) as failed:
            for i in range(20):  # ack=fsync: one fsync each, until the 4th of the stream fails
                value = f"m{i}".encode()
                client.publish(FSYNC_BAD, value, id=f"id-{i}", ack="fsync")
                acked.append(value)
        assert 1 <= len(acked) <= 3
        error = failed.value
        assert error.code == grpc.StatusCode.INTERNAL
        assert error.reason == pb.ERROR_REASON_INTERNAL
        assert str(error).startswith(
            f"disk error on stream '{FSYNC_BAD}': fsync of its log failed ([Errno 5] ")
        assert f"stream '{FSYNC_BAD}' refuses writes until the broker is restarted" in str(error)

        # The stream refuses writes at once (no hang, no retry loop), and says why.
        with pytest.raises(BrokerInternalError, match=f"disk error on stream '{FSYNC_BAD}': "
                                                      "an earlier write or fsync failed"):
            client.publish(FSYNC_BAD, b"later", ack="write")
        # Everything else goes on: another stream, reads and a group of the failed one.
        for i in range(5):
            client.publish(GOOD, f"g{i}".encode(), ack="fsync")
        assert _values(client, GOOD) == [f"g{i}".encode() for i in range(5)]
        stored = _values(client, FSYNC_BAD)
        assert stored[:len(acked)] == acked  # may hold the failed one too: it was written
        assert len(stored) in (len(acked), len(acked) + 1)
        assert [m.value for m in client.consumer(FSYNC_BAD, "readers").pull(10)] == stored
        assert eio_broker.proc is not None and eio_broker.proc.poll() is None
    assert "disk error, the log refuses writes until it is reopened" in eio_broker.log_text()

    # A restart (without the fault) reopens the stream: the acknowledged messages
    # are there exactly once, and it takes writes again.
    assert eio_broker.stop() == 0
    del eio_broker.extra_env["NPSTREAM_STORAGE_FAULT"]
    assert set(check_files(eio_broker.data_dir)) >= {FSYNC_BAD, GOOD}
    eio_broker.start()
    with Client(eio_broker.address) as client:
        after = _values(client, FSYNC_BAD)
        assert after[:len(acked)] == acked and len(after) <= len(acked) + 1
        client.publish(FSYNC_BAD, b"after-restart", ack="fsync")
        assert _values(client, FSYNC_BAD) == [*after, b"after-restart"]
        assert _values(client, GOOD) == [f"g{i}".encode() for i in range(5)]


def test_a_failed_write_is_internal_stores_nothing_and_the_stream_goes_on(
        eio_broker: BrokerProcess) -> None:
    batches = [[f"b{n}-{i}".encode() for i in range(3)] for n in range(4)]
    with Client(eio_broker.address, retry_deadline=5) as client:
        client.create_stream(WRITE_BAD)
        client.publish_batch(WRITE_BAD, _batch(batches[0]), ack="fsync")
        client.publish_batch(WRITE_BAD, _batch(batches[1]), ack="fsync")
        with pytest.raises(BrokerInternalError) as failed:  # the 3rd frame write fails
            client.publish_batch(WRITE_BAD, _batch(batches[2]), ack="fsync")
        assert str(failed.value).startswith(
            f"disk error on stream '{WRITE_BAD}': the append failed ([Errno 5] ")
        assert str(failed.value).endswith(
            "nothing of it was stored; the stream takes writes again")
        client.publish_batch(WRITE_BAD, _batch(batches[3]), ack="fsync")
        assert _values(client, WRITE_BAD) == [*batches[0], *batches[1], *batches[3]]
    assert (f"stream {WRITE_BAD}: the append failed with a disk error and was undone"
            in eio_broker.log_text())
    eio_broker.restart(hard=True)
    with Client(eio_broker.address) as client:
        assert _values(client, WRITE_BAD) == [*batches[0], *batches[1], *batches[3]]

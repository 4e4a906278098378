"""Ten thousand streams on one broker stay within the open-file cap."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable

import grpc
import pytest

from npstream.proto import pb, pb_grpc

STREAMS = 10_000
MAX_OPEN_FILES = 64
# Requests kept in flight by the test client (a busy producer fleet).
IN_FLIGHT = 32
# Files the process holds besides segment handles: SQLite (db, wal, shm), the
# data-dir lock, the listening and client sockets, epoll/eventfds, stdio, log
# (measured: 13-14 after start).
FIXED_FDS = 20
# Creating a stream directory briefly opens it and its parent to fsync them,
# so each in-flight request may hold one short-lived directory handle.
FD_SLACK = FIXED_FDS + IN_FLIGHT


def pipelined(calls: Iterable[Callable[[], grpc.Future]]) -> list[object]:
    """Run futures with at most IN_FLIGHT outstanding; results in order."""
    pending: list[grpc.Future] = []
    results: list[object] = []
    for start in calls:
        pending.append(start())
        if len(pending) >= IN_FLIGHT:
            results.append(pending.pop(0).result(timeout=60))
    results += [f.result(timeout=60) for f in pending]
    return results


class FdSampler(threading.Thread):
    """Samples /proc/PID/fd every 20 ms and keeps the peak."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.02):
            try:
                self.peak = max(self.peak, len(os.listdir(f"/proc/{self.pid}/fd")))
            except FileNotFoundError:
                return


@pytest.mark.slow
def test_ten_thousand_streams_created_and_written_stay_under_the_fd_cap(broker_factory):
    broker = broker_factory(env={"NPSTREAM_MAX_OPEN_FILES": str(MAX_OPEN_FILES)})
    baseline = broker.open_fds()
    sampler = FdSampler(broker.pid)
    sampler.start()
    names = [f"many-{i:05d}" for i in range(STREAMS)]
    started = time.monotonic()
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        pipelined(lambda n=n: stub.CreateStream.future(pb.CreateStreamRequest(name=n))
                  for n in names)
        created_s = time.monotonic() - started
        replies = pipelined(
            lambda n=n: stub.Publish.future(pb.PublishRequest(
                stream=n, messages=[pb.Message(value=n.encode())], ack=pb.ACK_WRITE))
            for n in names)
        written_s = time.monotonic() - started - created_s
        assert all(r.first_offset == 0 and r.stored_count == 1 for r in replies)
        # Every stream answers, reopening logs that the LRU closed.
        reply = stub.EndOffsets(pb.EndOffsetsRequest(pattern="many-*"))
        assert sorted((s.stream, s.start_offset, s.end_offset) for s in reply.streams) == [
            (n, 0, 1) for n in names]
        for n in names[::500]:
            fetched = stub.Fetch(pb.FetchRequest(stream=n, offset=0))
            assert fetched.count == 1
        listed = 0
        token = ""
        while True:
            page = stub.ListStreams(pb.ListStreamsRequest(prefix="many-", page_size=5000,
                                                          page_token=token))
            listed += len(page.streams)
            token = page.next_page_token
            if not token:
                break
        assert listed == STREAMS
    sampler.done.set()
    sampler.join()
    print(f"\n{STREAMS} streams: create {created_s:.1f}s, publish {written_s:.1f}s, "
          f"fds baseline {baseline}, peak {sampler.peak} (cap {MAX_OPEN_FILES})")
    assert sampler.peak <= MAX_OPEN_FILES + FD_SLACK, (baseline, sampler.peak)

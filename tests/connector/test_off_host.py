"""A client whose host identity differs from the broker's takes the gRPC paths.

Local reads (client/local_reads.py) and staging by file (sink/inbox.py) are
only for a process on the broker's machine; anywhere else reads and Stage
data go over gRPC. One machine plays "another host" with $NPSTREAM_HOST_ID
(proto/host_identity.py), so both sides of each decision are exercised here
against one real broker, counted by the broker's metrics. The same with Spark
executors of a standalone cluster: tests/e2e/spark_cluster/test_standalone.py.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from npstream import Client
from npstream.proto.host_identity import HOST_ID_ENV, boot_id
from npstream.sink import inbox
from npstream.sink.client import SinkClient

LOCATED = "npstream_located_messages_total"
FETCHED = "npstream_fetched_messages_total"
BY_FILE = "npstream_sink_inbox_stages_total"


@pytest.fixture
def host_identity(monkeypatch, broker):
    """Set this process's host identity; everything learnt about the broker is forgotten."""

    def forget() -> None:
        boot_id.cache_clear()
        inbox._writers.pop((os.getpid(), broker.address), None)

    def set_identity(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv(HOST_ID_ENV, raising=False)
        else:
            monkeypatch.setenv(HOST_ID_ENV, value)
        forget()

    yield set_identity
    monkeypatch.delenv(HOST_ID_ENV, raising=False)
    forget()


def _metrics(broker) -> dict[str, float]:
    sample = broker.metrics()
    return {name: sample.get(name, 0.0) for name in (LOCATED, FETCHED, BY_FILE)}


def _read_and_write(broker, source: str, target: str, sink_id: str) -> list[int]:
    """Read source [0, 40) and stage + commit 40 rows into target, as a Spark task would."""
    with Client(broker.address) as client:
        offsets = [o for b in client.read_range(source, 0, 40)
                   for o in b.column("offset").to_pylist()]
        sink = SinkClient(client)
        sink.stage(sink_id, 0, "0-0", target,
                   pa.table({"value": pa.array([b"x%d" % i for i in range(40)], pa.binary())}))
        sink.commit(sink_id, 0, ["0-0"])
    return offsets


@pytest.mark.parametrize("identity, local", [
    (None, True),          # the kernel's boot id, as the broker has it: files are used
    ("elsewhere", False),  # another host: everything over gRPC
])
def test_local_paths_only_on_the_brokers_host(broker, client, stream_name, host_identity,
                                              identity, local):
    client.publish_batch(stream_name, [{"value": f"m{i}".encode()} for i in range(40)])
    host_identity(identity)
    before = _metrics(broker)

    offsets = _read_and_write(broker, stream_name, f"{stream_name}-out", f"s-{stream_name}")

    after = _metrics(broker)
    assert offsets == list(range(40))
    assert client.stream_info(f"{stream_name}-out").end_offset == 40
    moved = {name: after[name] - before[name] for name in after}
    if local:  # read from the segment files, staged through an inbox file
        assert moved == {LOCATED: 40, FETCHED: 0, BY_FILE: 1}
    else:  # every row over gRPC, both ways (the client's one Locate told it "another host")
        assert (moved[FETCHED], moved[BY_FILE]) == (40, 0)

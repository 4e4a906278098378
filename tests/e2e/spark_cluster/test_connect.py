"""npstream through Spark Connect: a thin client session, the data source on the server.

The client session (in a child process: connect_client.py) has no npstream
Spark code in the loop: it sends plans naming format("npstream") to the
Connect server (conftest.py), whose Python workers find the data source by
Spark's discovery (no registration call) and do every read and write. The
notebook runs against the same server.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

import connect_client
from connect_client import ConnectClient
from harness import REPO_ROOT, BrokerProcess
from npstream import Client
from npstream.proto.schema import MESSAGE_SCHEMA

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPLAYED = "npstream_sink_replayed_commits_total"


@pytest.fixture(scope="module")
def remote(connect_server) -> Iterator[ConnectClient]:
    """A Connect session in a child process (connect_client.py says why)."""
    client = ConnectClient(connect_server.url)
    try:
        yield client
    finally:
        client.close()


def _stored(client: Client, stream: str) -> pa.Table:
    end = client.stream_info(stream).end_offset
    return pa.Table.from_batches(list(client.read_range(stream, 0, end)), schema=MESSAGE_SCHEMA)


def test_batch_read_through_connect(remote, broker: BrokerProcess, client: Client,
                                    stream_name: str) -> None:
    client.publish_batch(stream_name, [{"value": f"v{i}", "id": f"id-{i}", "key": f"k{i % 2}"}
                                       for i in range(30)])
    got = remote.run(connect_client.batch_read, broker.address, stream_name,
                     "offset >= 10 AND key = CAST('k1' AS BINARY)")
    assert got["columns"] == ["stream", "offset", "id", "key", "value", "timestamp"]
    assert got["rows"] == [(i, f"id-{i}", f"v{i}") for i in range(11, 30, 2)]


def test_streaming_read_of_a_typed_stream_through_connect(
        remote, broker: BrokerProcess, client: Client, stream_name: str) -> None:
    client.create_stream(stream_name, schema="sensorId STRING NOT NULL, reading DOUBLE, "
                                             "ts TIMESTAMP")
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    client.publish_batch(stream_name, [
        {"value": {"sensorId": f"s{i % 2}", "reading": i / 2, "ts": t0 + dt.timedelta(seconds=i)}}
        for i in range(25)])
    got = remote.run(connect_client.streaming_read, broker.address, stream_name,
                     f"connect_read_{stream_name.replace('-', '_')}", 10)
    assert got["exception"] is None
    assert got["input_rows"] == [10, 10, 5]
    assert got["columns"] == ["stream", "offset", "id", "key", "timestamp",
                              "sensorId", "reading", "ts"]
    assert [(r["offset"], r["sensorId"], r["reading"], r["ts"]) for r in got["rows"]] == [
        (i, f"s{i % 2}", i / 2, f"{t0 + dt.timedelta(seconds=i):%Y-%m-%d %H:%M:%S}")
        for i in range(25)]  # CAST(ts AS STRING) in the server's session time zone, UTC


def test_exactly_once_streaming_write_through_connect(
        remote, broker: BrokerProcess, client: Client, stream_name: str, tmp_path: Path) -> None:
    """A copy whose last batch is replayed (its commit forgotten by the checkpoint) writes once."""
    source, target = f"{stream_name}-src", f"{stream_name}-dst"
    checkpoint = tmp_path / "checkpoint"  # a path on the server: the same machine here
    client.publish_batch(source, [{"value": f"v{i}", "id": f"id-{i}"} for i in range(40)])

    def copy() -> list[int]:
        got = remote.run(connect_client.copy, broker.address, source, target, str(checkpoint),
                         20)
        assert got["exception"] is None
        return got["batches"]

    assert copy() == [0, 1]
    (checkpoint / "commits" / "1").unlink()
    (checkpoint / "commits" / ".1.crc").unlink(missing_ok=True)
    client.publish_batch(source, [{"value": f"v{i}", "id": f"id-{i}"} for i in range(40, 50)])
    replayed = broker.metrics().get(REPLAYED, 0)

    assert copy() == [1, 2]  # batch 1 again, then the 10 new messages

    assert broker.metrics()[REPLAYED] == replayed + 1
    copied = _stored(client, target)
    assert copied.column("id").to_pylist() == [f"id-{i}" for i in range(50)]
    assert copied.column("value").to_pylist() == [f"v{i}".encode() for i in range(50)]


def test_notebook_runs_against_spark_connect(connect_server, broker: BrokerProcess,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The notebook with SPARK_REMOTE set: the same cells and results as with local Spark."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("NPSTREAM_BROKER", broker.address)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("SPARK_REMOTE", connect_server.url)
    nb = nbformat.read(REPO_ROOT / "examples" / "notebook.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    remote_session = [o for o in nb.cells[5].outputs if o.get("output_type") == "stream"]
    assert "sc://" in "".join(o["text"] for o in remote_session)  # it said where it ran
    table = nb.cells[9].outputs[-1]["data"]["text/plain"].splitlines()
    assert [line.split()[3:] for line in table[1:]] == [
        ["sensor-1", "3", "20.0", "40.0"], ["sensor-2", "2", "20.0", "30.0"],
        ["sensor-1", "2", "70.0", "80.0"], ["sensor-2", "3", "70.0", "90.0"],
        ["sensor-1", "1", "100.0", "100.0"], ["sensor-2", "1", "110.0", "110.0"]]

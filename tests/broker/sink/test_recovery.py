"""Sink commits interrupted by a broker crash finish exactly once at restart; staging GC.

The crash points come from the test-only fault hook NPSTREAM_SINK_FAULT
(npstream.broker.faults): the broker process os._exit()s at an exact
step of a commit, which is what kill -9 at that instant would leave behind.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pyarrow as pa
import pytest

from npstream import Client
from npstream.broker.faults import FAULT_EXIT_CODE
from npstream.broker.faults import SINK_FAULT_ENV as FAULT_ENV
from npstream.errors import BrokerUnavailable
from npstream.proto.schema import MESSAGE_SCHEMA
from npstream.sink.client import SinkConflict

ORDERS, AUDIT = "orders", "audit"


def read(client: Client, stream: str) -> pa.Table:
    info = client.stream_info(stream)
    return pa.Table.from_batches(list(client.read_range(stream, info.start_offset,
                                                        info.end_offset)),
                                 schema=MESSAGE_SCHEMA)


def staged_tables() -> list[pa.Table]:
    """Two task stagings routing rows to two streams; value i goes to orders unless i % 3 == 0."""
    tables = []
    for part in range(2):
        numbers = range(part * 600, part * 600 + 600)
        tables.append(pa.table({
            "value": [f"v{i}" for i in numbers],
            "id": [f"id-{i}" for i in numbers],
            "stream": [AUDIT if i % 3 == 0 else ORDERS for i in numbers],
        }))
    return tables


def expected(stream: str) -> list[str]:
    return [f"id-{i}" for i in range(1200) if (AUDIT if i % 3 == 0 else ORDERS) == stream]


def crash_mid_commit(proc, batch: int, tables: list[pa.Table], stream: str | None) -> None:
    """Publish 3 rows to orders, stage ``tables`` for sink 'crashy', commit: the broker dies."""
    with Client(proc.address, retry_deadline=1.0) as client:
        client.publish_batch(ORDERS, [{"value": b"pre", "id": f"pre-{i}"} for i in range(3)])
        sink = client.sink()
        ids = [f"{batch}-{part}" for part in range(len(tables))]
        for staging_id, table in zip(ids, tables, strict=True):
            sink.stage("crashy", batch, staging_id, stream, table)
        with pytest.raises(BrokerUnavailable):
            sink.commit("crashy", batch, ids)
    assert proc.proc.wait(10) == FAULT_EXIT_CODE


@pytest.mark.parametrize(("fault", "env", "recovery_log"), [
    ("marker", {}, r"append to 'audit' at offset 0 had no complete row on disk"),
    ("append", {}, r"append to 'audit' at \[0,400\) had completed; marked done"),
    ("torn:40", {}, r"append to 'audit' at offset 0 had no complete row on disk"),
    # Small frames: the torn append leaves whole frames of the commit on disk.
    ("torn:6000", {"NPSTREAM_MAX_BATCH_BYTES": "2KiB"},
     r"append to 'audit' at offset 0 was torn \(([1-9]\d*) of 400 rows on disk\); "
     r"truncated to offset 0"),
    ("done:1", {}, r"finishing a commit interrupted by a restart \(2 staging\(s\), "
                   r"streams \['audit', 'orders'\]\)"),
])
def test_commit_killed_mid_commit_is_finished_exactly_once_at_restart(broker_factory, fault,
                                                                      env, recovery_log):
    proc = broker_factory("data", env={FAULT_ENV: fault, **env})
    crash_mid_commit(proc, 7, staged_tables(), None)
    assert f"test fault hook {FAULT_ENV}" in proc.log_text()

    proc.extra_env.pop(FAULT_ENV)
    proc.start()

    with Client(proc.address) as client:
        orders, audit = read(client, ORDERS), read(client, AUDIT)
        assert orders.column("id").to_pylist() == [f"pre-{i}" for i in range(3)] + expected(
            ORDERS)
        assert orders.column("offset").to_pylist() == list(range(3 + 800))
        assert audit.column("id").to_pylist() == expected(AUDIT)
        assert audit.column("offset").to_pylist() == list(range(400))
        sink = client.sink()
        assert sink.last_batch_id("crashy") == 7
        assert sink.commit("crashy", 7, ["7-0", "7-1"]).already_committed is True
        assert client.publish(ORDERS, b"after").offset == 803
    assert "finishing a commit interrupted by a restart" in proc.log_text()
    assert re.search(recovery_log, proc.log_text())
    if fault == "done:1":
        assert "append to 'orders'" not in proc.log_text()
    assert not list((Path(proc.data_dir) / "sink").rglob("*.arrow"))


def test_staging_survives_broker_kill_and_commits_after_restart(broker_factory):
    proc = broker_factory("data")
    with Client(proc.address) as client:
        client.sink().stage("durable", 0, "0-0", ORDERS, pa.table({"value": ["a", "b"]}))
    proc.restart(hard=True)
    with Client(proc.address) as client:
        result = client.sink().commit("durable", 0, ["0-0"])
        assert result.written == {ORDERS: (0, 2)}
        assert read(client, ORDERS).column("value").to_pylist() == [b"a", b"b"]


def test_orphaned_staging_older_than_ttl_is_garbage_collected(broker_factory):
    proc = broker_factory("data", env={"NPSTREAM_SINK_STAGING_TTL": "1s"})
    sink_dir = Path(proc.data_dir) / "sink" / "orphan"
    with Client(proc.address) as client:
        sink = client.sink()
        sink.stage("orphan", 0, "0-0", ORDERS, pa.table({"value": ["x"]}))
        assert [p.name for p in sink_dir.rglob("*.arrow")] == ["0-0.arrow"]
        deadline = time.monotonic() + 15
        while sink_dir.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not sink_dir.exists()
        with pytest.raises(SinkConflict, match=r"staging '0-0' not found \(aborted, expired"):
            sink.commit("orphan", 0, ["0-0"])
    assert "dropped expired staging '0-0'" in proc.log_text()


# ---------------------------------------------------------------- staged files adopted as segments

BIG_ROWS, SMALL_ROWS = 400, 5
ADOPT_ENV = {"NPSTREAM_SINK_ADOPT_MIN_BYTES": "16KiB"}  # the big stagings (~50 KB) are adopted


def adoption_tables() -> list[pa.Table]:
    """Three stagings of one stream: big (adopted), small (copied), big (adopted)."""
    sizes = [BIG_ROWS, SMALL_ROWS, BIG_ROWS]
    tables, first = [], 0
    for size in sizes:
        numbers = range(first, first + size)
        tables.append(pa.table({"value": [f"{i:0100d}" for i in numbers],
                                "id": [f"id-{i}" for i in numbers]}))
        first += size
    return tables


def stream_segments(proc, stream: str) -> list[int]:
    from npstream.broker.storage.files import list_segment_bases, stream_dir

    return list_segment_bases(stream_dir(Path(proc.data_dir), stream))


def test_large_single_stream_stagings_become_segments_without_a_copy(broker_factory):
    proc = broker_factory("data", env=ADOPT_ENV)
    total = 2 * BIG_ROWS + SMALL_ROWS
    with Client(proc.address) as client:
        client.publish(ORDERS, b"pre")
        sink = client.sink()
        for part, table in enumerate(adoption_tables()):
            sink.stage("adopt", 0, f"0-{part}", ORDERS, table)
        assert sink.commit("adopt", 0, ["0-0", "0-1", "0-2"]).written == {ORDERS: (1, 1 + total)}
        orders = read(client, ORDERS)
        assert orders.column("id").to_pylist()[1:] == [f"id-{i}" for i in range(total)]
        assert orders.column("value").to_pylist()[:2] == [b"pre", f"{0:0100d}".encode()]
        assert orders.column("offset").to_pylist() == list(range(1 + total))
        assert len(set(orders.column("timestamp").to_pylist()[1:])) == 1
        # Segments: the first publish's, then the first big staging (the small one was
        # copied into it), then the second big staging.
        assert stream_segments(proc, ORDERS) == [0, 1, 1 + BIG_ROWS + SMALL_ROWS]
        # Small commits are copied into the active segment: no new segment.
        sink.stage("adopt", 1, "1-0", ORDERS, pa.table({"value": ["tiny"]}))
        assert sink.commit("adopt", 1, ["1-0"]).written == {ORDERS: (1 + total, 2 + total)}
        assert stream_segments(proc, ORDERS) == [0, 1, 1 + BIG_ROWS + SMALL_ROWS]
        assert client.publish(ORDERS, b"after").offset == 2 + total
    assert re.search(rf"committed batch 0: {total} rows from 3 staging\(s\) \(2 adopted as "
                     r"segments\)", proc.log_text())
    assert not list((Path(proc.data_dir) / "sink").rglob("*.*"))
    proc.restart(hard=True)  # the adopted segments load like any other
    with Client(proc.address) as client:
        assert read(client, ORDERS).column("value").to_pylist()[-2:] == [b"tiny", b"after"]


@pytest.mark.parametrize(("fault", "recovery_log"), [
    ("marker", r"append to 'orders' at offset 3 had no complete row on disk"),
    ("stamped:1", r"append to 'orders' at offset 3 had no complete row on disk"),
    ("adopted:1", rf"append to 'orders' at offset 3 was torn \({BIG_ROWS} of "
                  rf"{2 * BIG_ROWS + SMALL_ROWS} rows on disk\); truncated to offset "
                  rf"{3 + BIG_ROWS} and writing it again from there"),
    # Every staged file is stamped before the first is adopted.
    ("stamped:2", r"append to 'orders' at offset 3 had no complete row on disk"),
    # The first big staging adopted and the small one copied, the second big one not yet.
    ("renaming:2", rf"was torn \({BIG_ROWS + SMALL_ROWS} of {2 * BIG_ROWS + SMALL_ROWS} rows "
                   rf"on disk\); truncated to offset {3 + BIG_ROWS + SMALL_ROWS}"),
    ("adopted:2", r"append to 'orders' at \[3,808\) had completed; marked done"),
])
def test_commit_killed_while_adopting_stagings_is_finished_exactly_once(broker_factory, fault,
                                                                         recovery_log):
    proc = broker_factory("data", env={FAULT_ENV: fault, **ADOPT_ENV})
    total = 2 * BIG_ROWS + SMALL_ROWS
    crash_mid_commit(proc, 4, adoption_tables(), ORDERS)

    proc.extra_env.pop(FAULT_ENV)
    proc.start()
    with Client(proc.address) as client:
        orders = read(client, ORDERS)
        assert orders.column("id").to_pylist() == [f"pre-{i}" for i in range(3)] + [
            f"id-{i}" for i in range(total)]
        assert orders.column("offset").to_pylist() == list(range(3 + total))
        # One commit, one timestamp: a resumed append reuses the interrupted one's.
        assert len(set(orders.column("timestamp").to_pylist()[3:])) == 1
        sink = client.sink()
        assert sink.commit("crashy", 4, ["4-0", "4-1", "4-2"]).already_committed is True
        assert client.publish(ORDERS, b"after").offset == 3 + total
    assert re.search(recovery_log, proc.log_text())
    assert stream_segments(proc, ORDERS) == [0, 3, 3 + BIG_ROWS + SMALL_ROWS]
    assert not list((Path(proc.data_dir) / "sink").rglob("*.*"))

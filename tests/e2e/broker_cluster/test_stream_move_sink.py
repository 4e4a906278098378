"""A stream's sink stagings and a move (issue 19): what is staged into a stream before it moves.

Rows are staged on the member that holds their stream and can only commit
there, so a move first drains the stream: new stagings into it wait, the
batches staged into it commit, for up to 5 s; a batch that stays uncommitted
makes the move fail with nothing changed. A Spark streaming copy whose target
stream moves writes every row once and does not fail.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from cluster_members import held, names_on, read_ids, wait_until
from harness import BrokerProcess
from npstream import Client, MoveFailed

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def members(cluster_members: list[BrokerProcess]) -> list[BrokerProcess]:
    """The module's two members (tests/e2e/broker_cluster/conftest.py)."""
    return cluster_members


def name_on(members: list[BrokerProcess], broker: BrokerProcess, prefix: str) -> str:
    return names_on(broker.address, [b.address for b in members], prefix)[0]


def sink_rows(prefix: str, count: int) -> pa.Table:
    return pa.table({"value": [f"{prefix}{i}".encode() for i in range(count)],
                     "id": [f"{prefix}{i}" for i in range(count)]})


def test_a_sink_batch_staged_before_a_move_commits_once_while_the_move_drains(members):
    """The move waits for the batch staged into the stream; new stagings go to the new member."""
    source, target = members
    stream = name_on(members, source, f"mvs{uuid.uuid4().hex[:6]}")
    sink_id = f"sink-{stream}"
    moved: list[object] = []
    with Client(source.address, retry_deadline=30) as client:
        sink = client.sink()
        first = sink.stage(sink_id, 0, "b0", stream, sink_rows("a", 5))
        sink.commit_all(sink_id, 0, {b: ["b0"] for b in first.brokers})
        staged = sink.stage(sink_id, 1, "b1", stream, sink_rows("b", 7))
        assert staged.brokers == (source.address,)
        mover = threading.Thread(target=lambda: moved.append(
            client.move_stream(stream, target.address)))
        started = time.monotonic()
        mover.start()
        time.sleep(1.0)
        assert mover.is_alive() and stream in held(source)  # waiting for batch 1
        result = sink.commit_all(sink_id, 1, {source.address: ["b1"]})
        assert result.written[stream] == (5, 12)
        mover.join(60)
        assert 1.0 <= time.monotonic() - started < 10
        assert moved and moved[0].target == target.address  # type: ignore[attr-defined]
        assert stream in held(target) and stream not in held(source)
        later = sink.stage(sink_id, 2, "b2", stream, sink_rows("c", 3))
        assert later.brokers == (target.address,)
        assert sink.commit_all(sink_id, 2, {target.address: ["b2"]}).written[stream] == (12, 15)
        # Batch 1 replayed (a restarted query): staged at the new member, appends nothing.
        again = sink.stage(sink_id, 1, "b1-again", stream, sink_rows("b", 7))
        assert again.brokers == (target.address,)
        sink.commit_all(sink_id, 1, {target.address: ["b1-again"]})
        expected = [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(7)] + [
            f"c{i}" for i in range(3)]
        assert read_ids(client, stream) == expected


def test_a_move_fails_while_a_staged_sink_batch_stays_uncommitted_and_changes_nothing(members):
    """Rows staged into the stream that do not commit within the drain would be stranded: the
    move fails naming the batch, the stream is served where it was, the batch commits there
    once, and the move then goes through."""
    source, target = members
    stream = name_on(members, source, f"mvo{uuid.uuid4().hex[:6]}")
    sink_id = f"sink-{stream}"
    with Client(source.address, retry_deadline=30) as client:
        sink = client.sink()
        first = sink.stage(sink_id, 0, "b0", stream, sink_rows("a", 5))
        sink.commit_all(sink_id, 0, {b: ["b0"] for b in first.brokers})
        sink.stage(sink_id, 1, "b1", stream, sink_rows("b", 7))
        started = time.monotonic()
        with pytest.raises(MoveFailed, match=f"rows of sink '{sink_id}' batch 1 are staged"):
            client.move_stream(stream, target.address)
        assert time.monotonic() - started >= 5.0  # waited out the drain (DRAIN_WAIT_S)
        assert stream in held(source) and stream not in held(target)
        client.publish(stream, b"served", id="served")  # not paused
        assert sink.commit_all(sink_id, 1, {source.address: ["b1"]}).written[stream] == (6, 13)
        assert client.move_stream(stream, target.address).end_offset == 13
        # Batch 1 replayed at the new member (a restarted query): nothing appended.
        again = sink.stage(sink_id, 1, "b1-again", stream, sink_rows("b", 7))
        assert again.brokers == (target.address,)
        sink.commit_all(sink_id, 1, {target.address: ["b1-again"]})
        assert read_ids(client, stream) == [f"a{i}" for i in range(5)] + ["served"] + [
            f"b{i}" for i in range(7)]
    assert stream in held(target) and stream not in held(source)


def staged_index(staging: Path) -> bool:
    """Whether a staging's index file is in the staging area (rows staged, not committed)."""
    try:
        return any(staging.glob("*/*/*.index"))
    except OSError:
        return False


def test_a_spark_query_writing_into_a_stream_that_moves_writes_every_row_once(
        members, spark, tmp_path):
    """A streaming npstream -> npstream copy runs while its target stream moves: the batch
    staged when the move starts commits before it (the drain), the next ones stage at the new
    member, and the query never fails."""
    from npstream.spark import register

    register(spark)
    source, target = members
    src = name_on(members, target, f"mvsrc{uuid.uuid4().hex[:6]}")
    dst = name_on(members, source, f"mvdst{uuid.uuid4().hex[:6]}")
    published: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        with Client(target.address) as producer:
            while not stop.is_set():
                batch = [f"e{len(published) + i}" for i in range(20)]
                producer.publish_batch(src, [{"value": i.encode(), "id": i} for i in batch])
                published.extend(batch)
                time.sleep(0.05)

    with Client(source.address, retry_deadline=60) as client:
        client.create_stream(src)
        client.create_stream(dst)
        producer = threading.Thread(target=produce)
        producer.start()
        query = (spark.readStream.format("npstream").option("broker", source.address)
                 .option("stream", src).option("startingOffsets", "earliest").load()
                 .selectExpr("id", "value")
                 .writeStream.format("npstream").option("broker", source.address)
                 .option("stream", dst).option("checkpointLocation", str(tmp_path / "ckpt"))
                 .trigger(processingTime="200 milliseconds").start())
        try:
            wait_until(lambda: client.stream_info(dst).end_offset > 0, 180)
            # Move as a batch's rows are staged on the source and not yet committed (most
            # runs: the drain then waits for that commit; else between two batches).
            staging = source.data_dir / "sink"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not staged_index(staging):
                time.sleep(0.002)
            moved = client.move_stream(dst, target.address)
            try:
                wait_until(lambda: client.stream_info(dst).end_offset > moved.end_offset + 100,
                           120)
                stop.set()
                producer.join(30)
                wait_until(lambda: client.stream_info(dst).end_offset >= len(published), 120)
            except AssertionError:
                raise AssertionError(f"the copy stopped: {query.exception()!r}, "
                                     f"{query.status}, {query.lastProgress}") from None
            time.sleep(1.0)  # a batch too many would show now
            assert query.exception() is None, query.exception()
        finally:
            stop.set()
            query.stop()
        ids = read_ids(client, dst)
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(published)
    assert dst in held(target) and dst not in held(source)

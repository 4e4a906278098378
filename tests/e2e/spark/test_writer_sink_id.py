"""The sink id in real local Spark: keyed on the query's identity in its checkpoint.

A path string or a query name is the wrong key for the sink's commits on
the broker (npstream.spark.checkpoint): each test below is a way that key
lost or doubled rows without an error.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException

from npstream import Client
from npstream.errors import StreamNotFound
from npstream.spark.checkpoint import checkpoint_query_id, query_sink_id

pytestmark = pytest.mark.spark

ROWS = 100
ROOT_CONF = "spark.sql.streaming.checkpointLocation"


@pytest.fixture(scope="module")
def npstream_spark(spark):
    from npstream.spark import register

    register(spark)
    return spark


def copy(spark, broker, source: str, target: str, *, checkpoint: Path | None = None,
         query_name: str | None = None, **write_options: str):
    """Copy ``source`` to ``target`` with Trigger.AvailableNow, 50 rows a batch; the query."""
    frame = (spark.readStream.format("npstream").option("broker", broker.address)
             .option("stream", source).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "50").load())
    writer = (frame.writeStream.format("npstream").option("broker", broker.address)
              .option("stream", target).trigger(availableNow=True))
    if checkpoint is not None:
        writer = writer.option("checkpointLocation", str(checkpoint))
    if query_name is not None:
        writer = writer.queryName(query_name)
    for key, value in write_options.items():
        writer = writer.option(key, value)
    query = writer.start()
    query.awaitTermination(120)
    return query


def ids(client: Client, stream: str) -> list[str]:
    try:
        end = client.stream_info(stream).end_offset
    except StreamNotFound:
        return []
    return [i for batch in client.read_range(stream, 0, end) for i in batch.column("id")
            .to_pylist()]


def publish(client: Client, stream: str) -> list[str]:
    client.publish_batch(stream, [{"value": b"v", "id": f"id-{i}"} for i in range(ROWS)])
    return [f"id-{i}" for i in range(ROWS)]


def test_rerun_with_checkpoint_deleted_writes_every_row_again(npstream_spark, broker, client,
                                                              stream_name, tmp_path):
    source, target = f"{stream_name}-a", f"{stream_name}-b"
    expected = publish(client, source)
    checkpoint = tmp_path / "checkpoint"
    assert copy(npstream_spark, broker, source, target, checkpoint=checkpoint).exception() is None
    first_sink = query_sink_id(str(checkpoint_query_id(str(checkpoint))))
    shutil.rmtree(checkpoint)
    client.delete_stream(target)

    assert copy(npstream_spark, broker, source, target, checkpoint=checkpoint).exception() is None
    assert ids(client, target) == expected
    assert query_sink_id(str(checkpoint_query_id(str(checkpoint)))) != first_sink


def test_same_query_name_under_two_checkpoint_roots_writes_both(npstream_spark, broker, client,
                                                                stream_name, tmp_path):
    source = f"{stream_name}-a"
    expected = publish(client, source)
    name = f"copy_{stream_name.replace('-', '_')}"
    try:
        for root in ("one", "two"):
            npstream_spark.conf.set(ROOT_CONF, str(tmp_path / root))
            query = copy(npstream_spark, broker, source, f"{stream_name}-{root}",
                         query_name=name)
            assert query.exception() is None
    finally:
        npstream_spark.conf.unset(ROOT_CONF)
    assert ids(client, f"{stream_name}-one") == expected
    assert ids(client, f"{stream_name}-two") == expected


def test_replay_through_symlinked_checkpoint_appends_nothing_twice(npstream_spark, broker,
                                                                   client, stream_name,
                                                                   tmp_path):
    """The state a driver crash leaves: the broker committed batch 1, Spark's commit log
    lacks it. The restart, through another path to the same checkpoint, replays it."""
    source, target = f"{stream_name}-a", f"{stream_name}-b"
    expected = publish(client, source)
    checkpoint, link = tmp_path / "checkpoint", tmp_path / "link"
    link.symlink_to(checkpoint)
    assert copy(npstream_spark, broker, source, target, checkpoint=checkpoint).exception() is None
    (checkpoint / "commits" / "1").unlink()
    (checkpoint / "commits" / ".1.crc").unlink(missing_ok=True)

    query = copy(npstream_spark, broker, source, target, checkpoint=link)
    assert query.exception() is None
    assert [p["batchId"] for p in query.recentProgress] == [1]
    assert ids(client, target) == expected


def test_explicit_sink_id_with_a_new_checkpoint_refuses_to_start(npstream_spark, broker, client,
                                                                 stream_name, tmp_path):
    source, target = f"{stream_name}-a", f"{stream_name}-b"
    expected = publish(client, source)
    sink_id = f"{stream_name}-sink"
    first = copy(npstream_spark, broker, source, target, checkpoint=tmp_path / "first",
                 sinkId=sink_id)
    assert first.exception() is None

    second = tmp_path / "second"
    with pytest.raises(StreamingQueryException) as info:  # Spark plans batch 0, then asks
        copy(npstream_spark, broker, source, target, checkpoint=second, sinkId=sink_id)
    message = str(info.value)
    assert ("Failed to initialize Python data source writer: npstream.errors.SinkConflict: "
            f"npstream sink '{sink_id}' has batches up to 1 committed on broker "
            f"{broker.address}, but the query's checkpoint '{second}' has planned batches only "
            "up to 0: it is not the checkpoint that wrote them") in message, message
    assert ids(client, target) == expected

"""The streaming reader's driver-side decisions against a real broker, without Spark.

initialOffset, latestOffset (read limits, maxTriggerDelay with an injected
clock, AvailableNow, new/deleted/re-created streams), partitions, read and
commit are called the way Spark's Python runner calls them, so each rule is
checked exactly and fast.
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from npstream import Client
from npstream.proto import pb
from npstream.spark.data_loss import DataLossError
from npstream.spark.options import InvalidOptionError, parse_read_options
from npstream.spark.range_reader import RangePartition
from npstream.spark.stream_reader import NpstreamStreamReader


class FakeClock:
    """Seconds that only move when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def publish(client: Client, stream: str, count: int, start: int = 0) -> None:
    client.publish_batch(stream, [{"value": f"v{i}".encode(), "id": f"{stream}-{i}"}
                                  for i in range(start, start + count)])


def make_reader(broker, clock=None, **options: str) -> NpstreamStreamReader:
    parsed = parse_read_options({"broker": broker.address, **{k.lower(): v for k, v in
                                                               options.items()}}, "stream")
    return NpstreamStreamReader(parsed, clock=clock) if clock else NpstreamStreamReader(parsed)


@pytest.fixture
def reader_factory(broker):
    made: list[NpstreamStreamReader] = []

    def make(clock=None, **options: str) -> NpstreamStreamReader:
        reader = make_reader(broker, clock, **options)
        made.append(reader)
        return reader

    yield make
    for reader in made:
        reader.stop()


def read_all(reader: NpstreamStreamReader, start: dict, end: dict) -> pa.Table:
    batches = [b for part in reader.partitions(start, end) for b in reader.read(part)]
    return pa.Table.from_batches(batches) if batches else pa.table({})


def test_initial_offset_earliest_latest_and_json(reader_factory, client, stream_name):
    a, b = f"{stream_name}-a", f"{stream_name}-b"
    publish(client, a, 10)
    publish(client, b, 4)
    client.delete_messages(a, before_offset=3)
    both = f"{a},{b}"
    assert reader_factory(stream=both, startingOffsets="earliest").initialOffset() == {
        a: 3, b: 0}
    assert reader_factory(stream=both).initialOffset() == {a: 10, b: 4}
    assert reader_factory(stream=both, startingOffsets=json.dumps({a: 5, b: -1})
                          ).initialOffset() == {a: 5, b: 4}
    assert reader_factory(stream=both, startingOffsets=json.dumps({b: 2})
                          ).initialOffset() == {a: 3, b: 2}  # unlisted: earliest


def test_initial_offset_json_beyond_end_fails(reader_factory, client, stream_name):
    publish(client, stream_name, 4)
    reader = reader_factory(stream=stream_name, startingOffsets=json.dumps({stream_name: 9}))
    with pytest.raises(InvalidOptionError, match=(
            f"offset 9 for stream '{stream_name}' is beyond its end_offset 4")):
        reader.initialOffset()


def test_initial_offset_json_below_retention_is_data_loss(reader_factory, client,
                                                          stream_name, caplog):
    publish(client, stream_name, 10)
    client.delete_messages(stream_name, before_offset=6)
    start = json.dumps({stream_name: 2})
    with pytest.raises(DataLossError, match=r"offsets \[2, 6\) can no longer be read "
                                            r"\(startingOffsets asks for offset 2"):
        reader_factory(stream=stream_name, startingOffsets=start).initialOffset()
    with caplog.at_level(logging.WARNING, logger="npstream.spark.data_loss"):
        assert reader_factory(stream=stream_name, startingOffsets=start,
                              failOnDataLoss="false").initialOffset() == {stream_name: 6}
    assert "skipping offsets [2, 6)" in caplog.text


def test_initial_offset_pattern_may_match_nothing(reader_factory, stream_name):
    assert reader_factory(streamPattern=f"{stream_name}-*").initialOffset() == {}


def test_latest_offset_max_rows_is_proportional(reader_factory, client, stream_name):
    a, b = f"{stream_name}-a", f"{stream_name}-b"
    publish(client, a, 90)
    publish(client, b, 30)
    reader = reader_factory(stream=f"{a},{b}", startingOffsets="earliest")
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadMaxRows(40)) == {a: 30, b: 10}
    assert reader.reportLatestOffset() == {a: 90, b: 30}  # the broker's ends, not the batch's
    assert reader.latestOffset({a: 30, b: 10}, ReadMaxRows(40)) == {a: 60, b: 20}
    assert reader.latestOffset(start, ReadAllAvailable()) == {a: 90, b: 30}
    assert reader.reportLatestOffset() == {a: 90, b: 30}


def test_latest_offset_min_rows_waits_for_rows_or_max_trigger_delay(reader_factory, client,
                                                                    stream_name):
    publish(client, stream_name, 3)
    clock = FakeClock()
    reader = reader_factory(clock=clock, stream=stream_name, startingOffsets="earliest",
                            minOffsetsPerTrigger="10", maxTriggerDelay="30s")
    start = reader.initialOffset()
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMinRows(10)
    assert reader.latestOffset(start, limit) == {stream_name: 3}  # first batch always runs
    publish(client, stream_name, 4, start=3)
    clock.now += 29
    assert reader.latestOffset({stream_name: 3}, limit) == {stream_name: 3}  # 4 < 10: wait
    clock.now += 1
    assert reader.latestOffset({stream_name: 3}, limit) == {stream_name: 7}  # delay passed
    publish(client, stream_name, 10, start=7)
    clock.now += 1
    assert reader.latestOffset({stream_name: 7}, limit) == {stream_name: 17}  # enough rows


def test_latest_offset_min_and_max_together(reader_factory, client, stream_name):
    publish(client, stream_name, 5)
    clock = FakeClock()
    reader = reader_factory(clock=clock, stream=stream_name, startingOffsets="earliest",
                            minOffsetsPerTrigger="8", maxOffsetsPerTrigger="20")
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMaxRows(20)
    assert reader.latestOffset({stream_name: 0}, limit) == {stream_name: 5}
    publish(client, stream_name, 45, start=5)
    clock.now += 1
    assert reader.latestOffset({stream_name: 5}, limit) == {stream_name: 25}
    clock.now += 1
    assert reader.latestOffset({stream_name: 45}, limit) == {stream_name: 45}  # 5 < 8
    assert reader.latestOffset({stream_name: 45}, ReadAllAvailable()) == {stream_name: 50}


def test_available_now_stops_at_the_ends_recorded_at_start(reader_factory, client,
                                                           stream_name):
    publish(client, stream_name, 25)
    reader = reader_factory(stream=stream_name, startingOffsets="earliest",
                            maxOffsetsPerTrigger="10", minOffsetsPerTrigger="5")
    reader.prepareForTriggerAvailableNow()
    publish(client, stream_name, 30, start=25)  # arrives after the target was recorded
    limit = reader.getDefaultReadLimit()
    ends, position = [], reader.initialOffset()
    while (end := reader.latestOffset(position, limit)) != position:
        ends.append(end[stream_name])
        position = end
    assert ends == [10, 20, 25]
    # progress reports the broker's end (55), not AvailableNow's target (25)
    assert reader.reportLatestOffset() == {stream_name: 55}


def test_latest_offset_pattern_adds_new_stream_from_its_earliest_offset(
        reader_factory, client, stream_name):
    old, new = f"{stream_name}-old", f"{stream_name}-new"
    publish(client, old, 2)
    reader = reader_factory(streamPattern=f"{stream_name}-*", startingOffsets="latest",
                            maxOffsetsPerTrigger="3")
    start = reader.initialOffset()
    assert start == {old: 2}
    publish(client, new, 8)
    client.delete_messages(new, before_offset=2)  # not data loss: the query never had them
    end = reader.latestOffset(start, ReadMaxRows(3))
    assert end == {old: 2, new: 5}
    table = read_all(reader, start, end)
    assert table.column("stream").to_pylist() == [new] * 3
    assert table.column("offset").to_pylist() == [2, 3, 4]
    # A fresh reader re-planning the same batch (query restart) plans it the same way.
    replanned = reader_factory(streamPattern=f"{stream_name}-*")
    assert [(p.stream, p.start, p.end) for p in replanned.partitions(start, end)] == [
        (new, 2, 5)]


def test_latest_offset_deleted_stream_fails_or_is_dropped(reader_factory, client, stream_name,
                                                          caplog):
    keep, gone = f"{stream_name}-keep", f"{stream_name}-gone"
    publish(client, keep, 2)
    publish(client, gone, 2)
    pattern = f"{stream_name}-*"
    start = {keep: 2, gone: 1}
    client.delete_stream(gone)
    with pytest.raises(DataLossError, match=f"Data loss on stream '{gone}': offsets 1 and "
                                            "later can no longer be read .the stream was "
                                            "deleted"):
        reader_factory(streamPattern=pattern).latestOffset(start, ReadAllAvailable())
    with caplog.at_level(logging.WARNING, logger="npstream.spark.data_loss"):
        end = reader_factory(streamPattern=pattern, failOnDataLoss="false").latestOffset(
            start, ReadAllAvailable())
    assert end == {keep: 2}
    assert f"data loss on stream '{gone}'" in caplog.text
    named = reader_factory(stream=f"{keep},{gone}", failOnDataLoss="false")
    assert named.latestOffset(start, ReadAllAvailable()) == {keep: 2}


def test_recreated_stream_is_reported_and_read_again_from_zero(reader_factory, client,
                                                               stream_name):
    publish(client, stream_name, 8)
    client.delete_stream(stream_name)
    publish(client, stream_name, 3)
    start = {stream_name: 8}
    with pytest.raises(DataLossError, match="it was deleted and re-created"):
        reader_factory(stream=stream_name).latestOffset(start, ReadAllAvailable())
    reader = reader_factory(stream=stream_name, failOnDataLoss="false")
    end = reader.latestOffset(start, ReadMaxRows(2))
    assert end == {stream_name: 2}
    assert read_all(reader, start, end).column("offset").to_pylist() == [0, 1]
    assert reader.latestOffset(end, ReadMaxRows(2)) == {stream_name: 3}


def test_partitions_and_read_return_exact_range_and_reread_identically(
        reader_factory, client, stream_name):
    publish(client, stream_name, 1000)
    reader = reader_factory(stream=stream_name, maxRecordsPerPartition="250",
                            fetchMaxBytes="4KiB")
    parts = reader.partitions({stream_name: 100}, {stream_name: 1000})
    assert [(p.stream, p.start, p.end) for p in parts] == [
        (stream_name, 100, 325), (stream_name, 325, 550), (stream_name, 550, 775),
        (stream_name, 775, 1000)]
    first = read_all(reader, {stream_name: 100}, {stream_name: 1000})
    again = read_all(reader, {stream_name: 100}, {stream_name: 1000})
    assert first.column("offset").to_pylist() == list(range(100, 1000))
    assert first.column("value").to_pylist() == [f"v{i}".encode() for i in range(100, 1000)]
    assert first.equals(again)
    assert reader.partitions({stream_name: 5}, {stream_name: 5}) == []


def test_read_skips_retention_gap_when_allowed(reader_factory, client, stream_name):
    publish(client, stream_name, 20)
    client.delete_messages(stream_name, before_offset=12)
    part = RangePartition(stream_name, 5, 15)
    with pytest.raises(DataLossError, match=r"offsets \[5, 12\) can no longer be read"):
        list(reader_factory(stream=stream_name).read(part))
    batches = list(reader_factory(stream=stream_name, failOnDataLoss="false").read(part))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == [12, 13, 14]


def test_read_of_a_later_piece_names_the_whole_removed_range(reader_factory, client,
                                                             stream_name):
    publish(client, stream_name, 40)
    reader = reader_factory(stream=stream_name, maxRecordsPerPartition="10")
    parts = reader.partitions({stream_name: 0}, {stream_name: 40})
    client.delete_messages(stream_name, before_offset=25)
    with pytest.raises(DataLossError) as info:
        list(reader.read(parts[2]))
    assert str(info.value).startswith(
        f"Data loss on stream '{stream_name}': offsets [20, 25) can no longer be read "
        "(retention moved the stream's start_offset to 25: offsets [0, 25) were removed "
        "before the query read them).")


def test_group_start_after_retention_removed_unread_reports_the_range(reader_factory, client,
                                                                      stream_name):
    publish(client, stream_name, 10)
    reader_factory(stream=stream_name, group="slow").commit({stream_name: 4})
    client.delete_messages(stream_name, before_offset=8)
    resumed = reader_factory(stream=stream_name, group="slow", startingOffsets="group")
    with pytest.raises(DataLossError, match=r"offsets \[4, 8\) can no longer be read \(group "
                       r"'slow' asks for offset 4 but retention moved the stream's start_offset "
                       r"to 8\)"):
        resumed.initialOffset()
    lenient = reader_factory(stream=stream_name, group="slow", startingOffsets="group",
                             failOnDataLoss="false")
    assert lenient.initialOffset() == {stream_name: 8}


def test_commit_records_group_position_with_lag(reader_factory, client, stream_name):
    publish(client, stream_name, 10)
    reader = reader_factory(stream=stream_name, group="lagging")
    reader.commit({stream_name: 7})
    info = client.call("GroupService.DescribeGroup",
                       pb.DescribeGroupRequest(stream=stream_name, group="lagging"))
    assert (info.committed_offset, info.lag) == (7, 3)
    resumed = reader_factory(stream=stream_name, group="lagging", startingOffsets="group")
    assert resumed.initialOffset() == {stream_name: 7}
    fresh = reader_factory(stream=stream_name, group="never-used", startingOffsets="group")
    assert fresh.initialOffset() == {stream_name: 0}


def test_read_of_range_beyond_a_shortened_stream_reports_loss(reader_factory, client,
                                                              stream_name):
    publish(client, stream_name, 10)
    client.delete_stream(stream_name)
    publish(client, stream_name, 3)
    part = RangePartition(stream_name, 0, 10)
    with pytest.raises(DataLossError, match=r"offsets \[3, 10\) can no longer be read "
                                            r"\(the stream now ends at offset 3\)"):
        list(reader_factory(stream=stream_name).read(part))
    batches = list(reader_factory(stream=stream_name, failOnDataLoss="false").read(part))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == [0, 1, 2]
    client.delete_stream(stream_name)
    with pytest.raises(DataLossError, match=r"offsets \[0, 10\) .*\(the stream was deleted\)"):
        list(reader_factory(stream=stream_name).read(part))

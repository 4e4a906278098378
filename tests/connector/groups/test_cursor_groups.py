"""Cursor groups (npayload / OKMQ) against a real broker process."""

from __future__ import annotations

import json
import threading
import time

import grpc
import pyarrow as pa
import pytest

from npstream.errors import GroupNotFound, InvalidArgument, OffsetOutOfRange, StreamNotFound
from npstream.groups.cursor import SeekResult
from npstream.proto import pb, pb_grpc
from npstream.proto.schema import MESSAGE_SCHEMA


def publish(client, stream: str, values: list[str]) -> list[int]:
    return client.publish_batch(stream, [{"value": v} for v in values]).offsets


def texts(batch) -> list[str]:
    return [m.text() for m in batch]


def test_pull_two_groups_from_latest_and_earliest_each_see_their_messages(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, ["old-1", "old-2"])
    dashboard = client.consumer(stream_name, "dashboard", start_from="latest")
    warehouse = client.consumer(stream_name, "warehouse", start_from="earliest")
    assert (dashboard.created, dashboard.position) == (True, 2)
    assert (warehouse.created, warehouse.position) == (True, 0)
    publish(client, stream_name, ["new-1", "new-2", "new-3"])

    assert texts(dashboard.pull(limit=100)) == ["new-1", "new-2", "new-3"]
    assert texts(warehouse.pull(limit=100)) == ["old-1", "old-2", "new-1", "new-2", "new-3"]
    assert len(dashboard.pull()) == 0 and len(warehouse.pull()) == 0
    infos = {g.group: g for g in client.list_groups(stream_name)}
    assert sorted(infos) == ["dashboard", "warehouse"]
    assert all((g.kind, g.committed_offset, g.lag) == ("cursor", 5, 0) for g in infos.values())


def test_pull_returns_message_schema_table_in_offset_order(client, stream_name):
    client.create_stream(stream_name)
    client.publish(stream_name, {"n": 1}, id="a", key="k", headers={"h": "x"})
    batch = client.consumer(stream_name, "g").pull(limit=10)
    assert batch.table.schema == MESSAGE_SCHEMA
    assert pa.table(batch).num_rows == 1  # Arrow C stream interface
    (message,) = list(batch)
    assert (message.offset, message.id, message.key, message.headers) == (0, "a", b"k",
                                                                           {"h": b"x"})
    assert message.json() == {"n": 1}
    assert abs(message.timestamp_ms - time.time() * 1000) < 60_000


def test_pull_limit_and_auto_commit_hand_out_each_message_once(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, [str(i) for i in range(25)])
    consumer = client.consumer(stream_name, "g")
    seen = []
    while batch := consumer.pull(limit=10):
        assert len(batch) <= 10
        seen += batch.offsets
    assert seen == list(range(25))
    assert consumer.position == 25


def test_pull_concurrent_pullers_of_one_group_never_share_a_message(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, [str(i) for i in range(300)])
    seen: list[list[int]] = [[], [], []]

    def worker(index: int) -> None:
        consumer = client.consumer(stream_name, "shared-cursor")
        while batch := consumer.pull(limit=7):
            seen[index] += batch.offsets

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    everything = sorted(o for part in seen for o in part)
    assert everything == list(range(300))


def test_pull_without_commit_returns_same_messages_until_commit(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, ["a", "b", "c", "d"])
    consumer = client.consumer(stream_name, "okmq")
    first = consumer.pull(limit=2, auto_commit=False)
    assert first.offsets == [0, 1]
    assert consumer.pull(limit=2, auto_commit=False).offsets == [0, 1]
    assert consumer.commit(1) == 2  # commit N: next read starts at N + 1
    assert consumer.pull(limit=10, auto_commit=False).offsets == [2, 3]
    assert consumer.commit() == 4  # no argument: the last pulled message
    assert len(consumer.pull(auto_commit=False)) == 0
    assert client.describe_group(stream_name, "okmq").committed_offset == 4


def test_open_existing_group_resumes_and_reports_start_from_ignored(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, ["a", "b", "c"])
    first = client.consumer(stream_name, "g", start_from="earliest")
    first.pull(limit=1)
    again = client.consumer(stream_name, "g", start_from="latest")
    assert (again.created, again.start_from_ignored, again.position) == (False, True, 1)
    assert texts(again.pull()) == ["b", "c"]


def test_open_group_from_offset_and_timestamp_dicts(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, ["a", "b", "c"])
    assert client.consumer(stream_name, "o", start_from={"offset": 2}).position == 2
    ts = client.stream_info(stream_name).last_timestamp_ms + 1
    assert client.consumer(stream_name, "t", start_from={"timestamp": ts}).position == 3


def test_seek_to_timestamp_replays_from_there(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, ["before-1", "before-2"])
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    publish(client, stream_name, ["after-1", "after-2"])
    consumer = client.consumer(stream_name, "replay")
    assert len(consumer.pull(limit=100)) == 4
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(cut // 1000)) + f".{cut % 1000:03d}Z"
    result = consumer.seek(timestamp=iso)
    assert (result.position, result.clamped_to_start, result.clamped_to_end) == (2, False, False)
    assert texts(consumer.pull(limit=100)) == ["after-1", "after-2"]


def test_seek_outside_the_stream_clamps_and_reports_it(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, [str(i) for i in range(10)])
    client.delete_messages(stream_name, before_offset=4)
    consumer = client.consumer(stream_name, "g")
    assert consumer.seek(offset=99) == SeekResult(10, False, True)
    assert consumer.seek(offset=1) == SeekResult(4, True, False)
    assert consumer.seek(offset=6) == SeekResult(6, False, False)
    assert consumer.seek(offset=1).position == 4
    assert consumer.pull(limit=1).offsets == [4]
    assert consumer.seek("latest").position == 10
    assert consumer.seek("earliest").position == 4


def test_seek_is_seen_by_other_consumers_of_the_group(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, ["a", "b", "c"])
    reader = client.consumer(stream_name, "g")
    assert len(reader.pull()) == 3
    client.consumer(stream_name, "g").seek(offset=1)
    assert texts(reader.pull()) == ["b", "c"]


def test_pull_wait_long_polls_until_a_publish(client, stream_name):
    client.create_stream(stream_name)
    consumer = client.consumer(stream_name, "g")
    timer = threading.Timer(0.3, lambda: client.publish(stream_name, "late"))
    timer.start()
    started = time.monotonic()
    batch = consumer.pull(wait=10.0)
    elapsed = time.monotonic() - started
    timer.join()
    assert texts(batch) == ["late"]
    assert 0.2 < elapsed < 5.0


def test_pull_wait_with_nothing_returns_empty_after_the_wait(client, stream_name):
    client.create_stream(stream_name)
    started = time.monotonic()
    assert len(client.consumer(stream_name, "g").pull(wait=0.4)) == 0
    assert 0.35 < time.monotonic() - started < 5.0


def test_replay_events_deposit_100_withdraw_25_gives_balance_75(client, stream_name):
    client.create_stream(stream_name)
    client.publish(stream_name, {"account": "acc-1", "type": "deposit", "amount": 100})
    client.publish(stream_name, {"account": "acc-1", "type": "withdrawal", "amount": 25})
    live = client.consumer(stream_name, "projection")
    live.pull()  # the live projection consumed everything already

    rebuild = client.consumer(stream_name, "projection-rebuild", start_from="earliest")
    balance = 0
    for event in rebuild.pull(limit=1000):
        change = event.json()
        balance += change["amount"] if change["type"] == "deposit" else -change["amount"]
    assert balance == 75


def test_commit_next_offset_creates_group_never_opened(client, stream_name):
    """What the Spark reader does: Commit(next_offset) then DescribeGroup for lag."""
    client.create_stream(stream_name)
    publish(client, stream_name, [str(i) for i in range(10)])
    response = client.call("GroupService.Commit", pb.CommitRequest(
        stream=stream_name, group="spark-query", next_offset=6))
    assert response.position.committed_offset == 6
    info = client.describe_group(stream_name, "spark-query")
    assert (info.kind, info.committed_offset, info.lag) == ("cursor", 6, 4)
    assert client.consumer(stream_name, "spark-query").pull().offsets == [6, 7, 8, 9]


def test_commit_past_end_is_out_of_range_with_offsets(client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, ["a", "b"])
    consumer = client.consumer(stream_name, "g")
    with pytest.raises(OffsetOutOfRange) as err:
        consumer.commit(2)  # next read would be 3 > end_offset 2
    assert (err.value.offset, err.value.start_offset, err.value.end_offset) == (2, 0, 2)
    assert stream_name in str(err.value)
    assert consumer.commit(next_offset=2) == 2


def test_pull_after_delete_before_reports_removed_range_then_continues_at_new_start(
        client, stream_name):
    client.create_stream(stream_name)
    publish(client, stream_name, [str(i) for i in range(10)])
    consumer = client.consumer(stream_name, "g")
    consumer.pull(limit=2)
    client.delete_messages(stream_name, before_offset=7)
    for _ in range(2):  # describing does not move the group past the loss
        info = client.describe_group(stream_name, "g")
        assert (info.committed_offset, info.lag, info.removed_unread) == (7, 3, (2, 7))
    assert consumer.pull().offsets == [7, 8, 9]
    info = client.describe_group(stream_name, "g")
    assert (info.committed_offset, info.removed_unread) == (10, None)


def test_describe_missing_group_is_not_found(client, stream_name):
    client.create_stream(stream_name)
    with pytest.raises(GroupNotFound, match=f"group 'nope' does not exist on stream "
                                            f"'{stream_name}'"):
        client.describe_group(stream_name, "nope")
    with pytest.raises(GroupNotFound):
        client.call("GroupService.Pull", pb.PullRequest(stream=stream_name, group="nope"))


def test_consumer_on_missing_stream_is_stream_not_found(client, stream_name):
    with pytest.raises(StreamNotFound, match=stream_name):
        client.consumer(stream_name, "g")


def test_cursor_group_used_as_shared_group_is_invalid_argument(client, stream_name):
    client.create_stream(stream_name)
    client.consumer(stream_name, "g")
    with pytest.raises(InvalidArgument, match="is a cursor group"):
        client.receive(stream_name, "g")


def test_bad_group_name_and_limits_are_invalid_argument(client, stream_name):
    client.create_stream(stream_name)
    with pytest.raises(InvalidArgument, match="invalid group name"):
        client.consumer(stream_name, "../etc")
    with pytest.raises(InvalidArgument, match="invalid start_from"):
        client.consumer(stream_name, "g", start_from="yesterday-ish")
    raw = grpc.insecure_channel(client.address)
    with pytest.raises(grpc.RpcError) as err:
        pb_grpc.GroupServiceStub(raw).Pull(pb.PullRequest(stream=stream_name, group="g",
                                                          limit=-1))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "PullRequest.limit=-1 is out of range: accepted 0..2147483647" in err.value.details()
    raw.close()


def test_delete_group_then_stream_leaves_nothing(client, stream_name):
    client.create_stream(stream_name)
    client.consumer(stream_name, "a")
    client.consumer(stream_name, "b")
    assert client.delete_group(stream_name, "a") is True
    assert client.delete_group(stream_name, "a") is False
    assert [g.group for g in client.list_groups(stream_name)] == ["b"]
    client.delete_stream(stream_name)
    client.create_stream(stream_name)
    assert client.list_groups(stream_name) == []
    fresh = client.consumer(stream_name, "b")
    assert (fresh.created, fresh.position) == (True, 0)


def test_group_info_to_dict_is_json(client, stream_name):
    client.create_stream(stream_name)
    client.consumer(stream_name, "g")
    data = client.describe_group(stream_name, "g").to_dict()
    assert json.loads(json.dumps(data))["group"] == "g"

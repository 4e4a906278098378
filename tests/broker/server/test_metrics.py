"""Every broker metric moves as it should under a known workload (a real broker process).

Per stream: messages and bytes in and out, offsets, size, segments, oldest
message age. Per group: committed offset, lag in messages and seconds,
in-flight leases, deliveries, redeliveries, acks, nacks, dead letters, pulls,
members connected. Histograms: publish latency by ack mode, fetch, fsync, sink
commit. Gauges: open files against their cap, connections, heap memory against
retain_freed_memory. Then the caps, token filtering and the JSON log format.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pyarrow as pa
import pytest

from harness import BrokerProcess, write_tokens_file
from npstream import Client, PermissionDenied, StreamNotFound
from npstream.proto import pb, pb_grpc


@pytest.fixture(scope="module")
def client(broker: BrokerProcess) -> Iterator[Client]:
    with Client(broker.address) as c:
        yield c


def delta(before: dict[str, float], after: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def series(stream: str, name: str, group: str | None = None) -> str:
    if group is None:
        return f'npstream_{name}{{stream="{stream}"}}'
    return f'npstream_{name}{{group="{group}",stream="{stream}"}}'


def test_stream_series_and_latency_histograms_follow_a_known_workload(broker, client):
    before = broker.metrics()
    for i in range(4):
        client.publish("m-s", {"n": i})                      # ack=fsync, 4 requests
    for i in range(2):
        client.publish("m-s", {"n": 10 + i}, ack="write")    # 2 requests
    client.publish_batch("m-s", [{"value": b"x" * 100}] * 4)  # one PublishStream request

    after = broker.metrics()
    assert delta(before, after, 'npstream_publish_latency_seconds_count{ack="fsync"}') == 5
    assert delta(before, after, 'npstream_publish_latency_seconds_count{ack="write"}') == 2
    assert delta(before, after, "npstream_fsync_latency_seconds_count") >= 1
    assert after[series("m-s", "stream_messages_in_total")] == 10
    assert after[series("m-s", "stream_bytes_in_total")] >= 400
    assert after[series("m-s", "stream_start_offset")] == 0
    assert after[series("m-s", "stream_end_offset")] == 10
    assert after[series("m-s", "stream_segments")] == 1
    retained = after[series("m-s", "stream_retained_bytes")]
    assert retained > 400
    assert 0 < after[series("m-s", "stream_oldest_message_age_seconds")] < 60
    assert after[series("m-s", "stream_messages_out_total")] == 0

    client.fetch("m-s", offset=0)
    fetched = broker.metrics()
    assert delta(after, fetched, "npstream_fetch_latency_seconds_count") == 1
    assert fetched[series("m-s", "stream_messages_out_total")] == 10
    assert fetched[series("m-s", "stream_bytes_out_total")] > 0
    list(client.read_range("m-s", 6, 10))  # local reads (Locate) or ReadRange: counted too
    assert broker.metrics()[series("m-s", "stream_messages_out_total")] == 14

    time.sleep(1.2)
    client.delete_messages("m-s", before_offset=6)
    trimmed = broker.metrics()
    assert trimmed[series("m-s", "stream_start_offset")] == 6
    assert trimmed[series("m-s", "stream_oldest_message_age_seconds")] >= 1.0
    assert trimmed["npstream_retained_bytes"] >= trimmed[series("m-s", "stream_retained_bytes")]


def test_stream_stats_rpc_reports_the_same_counts(broker, client):
    client.publish_batch("m-t", [{"value": b"abc"}] * 5)
    client.fetch("m-t", offset=1)
    stats = client.stream_stats(pattern="m-t*")
    assert [a.info.name for a in stats.streams] == ["m-t"]
    activity = stats.streams[0]
    assert (activity.info.end_offset, activity.messages_in, activity.messages_out) == (5, 5, 4)
    m = broker.metrics()
    assert activity.bytes_in == m[series("m-t", "stream_bytes_in_total")]
    assert activity.bytes_out == m[series("m-t", "stream_bytes_out_total")]
    assert stats.broker_start_ms <= stats.broker_time_ms <= time.time() * 1000 + 1000
    named = client.stream_stats(pattern=None, streams=["m-t"])
    assert [a.info.name for a in named.streams] == ["m-t"]
    assert client.stream_stats(pattern=None).streams == []
    with pytest.raises(StreamNotFound):
        client.stream_stats(streams=["m-t-missing"])


def test_group_series_follow_cursor_and_shared_groups(broker, client):
    stream = "m-g"
    client.create_stream(stream)
    client.publish_batch(stream, [{"value": f"v{i}".encode()} for i in range(10)])
    published = time.time()
    time.sleep(1.5)
    consumer = client.consumer(stream, "cursor")
    assert len(consumer.pull(limit=4)) == 4

    leases = client.receive(stream, "shared", max=5, ack_wait=30, max_deliver=2)
    assert [lease.offset for lease in leases] == [0, 1, 2, 3, 4]
    leases[0].ack()
    leases[1].ack()
    leases[2].nack()                           # attempt 1 failed: redelivered at once
    again = client.receive(stream, "shared", max=1, ack_wait=30, max_deliver=2)
    assert [(lease.offset, lease.attempt) for lease in again] == [(2, 2)]
    again[0].nack()                            # attempt 2 = max_deliver: dead-lettered

    m = broker.metrics()
    elapsed = time.time() - published
    assert m[series(stream, "group_committed_offset", "cursor")] == 4
    assert m[series(stream, "group_lag_messages", "cursor")] == 6
    assert 1.5 <= m[series(stream, "group_lag_seconds", "cursor")] <= elapsed + 0.5
    assert m[series(stream, "group_pulled_messages_total", "cursor")] == 4
    assert m[series(stream, "group_in_flight_leases", "cursor")] == 0

    assert m[series(stream, "group_committed_offset", "shared")] == 3  # 0, 1 acked; 2 dead
    assert m[series(stream, "group_lag_messages", "shared")] == 7
    assert m[series(stream, "group_in_flight_leases", "shared")] == 2   # 3 and 4
    assert m[series(stream, "group_delivered_messages_total", "shared")] == 6
    assert m[series(stream, "group_redelivered_messages_total", "shared")] == 1
    assert m[series(stream, "group_acked_messages_total", "shared")] == 2
    assert m[series(stream, "group_nacked_messages_total", "shared")] == 2
    assert m[series(stream, "group_dead_lettered_messages_total", "shared")] == 1
    assert m[series(stream, "group_members", "shared")] == 1
    assert m[series(stream, "group_members_connected", "shared")] == 0
    assert client.stream_info(f"{stream}.dlq").end_offset == 1
    # groups' reads count as the stream's messages out: 4 pulled + 6 delivered
    assert m[series(stream, "stream_messages_out_total")] == 10
    assert m["npstream_groups"] >= 2

    handled = threading.Event()
    subscription = client.subscribe(stream, "pushed", lambda lease: handled.set(),
                                     max_in_flight=4)
    try:
        assert handled.wait(10)
        connected = broker.metrics()
        assert connected[series(stream, "group_members_connected", "pushed")] == 1
        assert connected[series(stream, "group_members", "pushed")] == 1
    finally:
        subscription.stop()
    deadline = time.monotonic() + 10
    while broker.metrics()[series(stream, "group_members_connected", "pushed")] != 0:
        assert time.monotonic() < deadline, "the member still shows connected"
        time.sleep(0.1)

    client.delete_group(stream, "cursor")
    assert series(stream, "group_lag_messages", "cursor") not in broker.metrics()


def test_sink_commit_latency_and_messages_in(broker, client):
    before = broker.metrics()
    sink = client.sink()
    sink.stage("m-sink", 0, "0-0-0", "m-k", pa.table({"value": [b"a", b"b", b"c"]}))
    assert sink.commit("m-sink", 0, ["0-0-0"]).written == {"m-k": (0, 3)}
    after = broker.metrics()
    assert delta(before, after, "npstream_sink_commit_latency_seconds_count") == 1
    assert after[series("m-k", "stream_messages_in_total")] == 3
    assert after[series("m-k", "stream_end_offset")] == 3


def test_resource_gauges(broker, client):
    client.publish("m-r", b"x")
    m = broker.metrics()
    assert m["npstream_open_files_limit"] == 256
    assert 1 <= m["npstream_open_files"] <= 256
    assert m["npstream_connections"] >= 1          # this module's client
    assert m["npstream_memory_heap_free_limit_bytes"] == 256 * 1024 * 1024
    assert m["npstream_memory_heap_used_bytes"] > 1024 * 1024
    assert m["npstream_memory_heap_free_bytes"] >= 0
    assert m["npstream_publish_bytes_in_flight_limit"] == 256 * 1024 * 1024
    assert m["npstream_publish_bytes_in_flight"] == 0     # nothing being published now
    assert m["process_open_fds"] > m["npstream_open_files"]
    assert m["process_resident_memory_bytes"] > 0
    # a channel of its own (gRPC shares one connection per target between channels)
    with grpc.insecure_channel(broker.address,
                               options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        pb_grpc.StreamServiceStub(channel).ListStreams(pb.ListStreamsRequest(), timeout=10)
        assert broker.metrics()["npstream_connections"] == m["npstream_connections"] + 1


def test_above_the_caps_only_totals_are_exported(broker_factory):
    broker = broker_factory("capped", env={"NPSTREAM_METRICS_STREAM_GAUGES_MAX": "1",
                                           "NPSTREAM_METRICS_GROUP_GAUGES_MAX": "1"})
    with Client(broker.address) as client:
        client.publish("one", b"1")
        client.consumer("one", "g1").pull()
        single = broker.metrics()
        assert single['npstream_stream_end_offset{stream="one"}'] == 1
        assert single['npstream_group_committed_offset{group="g1",stream="one"}'] == 1
        client.publish("two", b"2")
        client.consumer("one", "g2").pull()
        capped = broker.metrics()
    assert not [k for k in capped if k.startswith(("npstream_stream_", "npstream_group_"))
                and "stream=" in k]
    assert capped["npstream_open_streams"] == 2
    assert capped["npstream_groups"] == 2
    assert capped["npstream_published_messages_total"] == 2
    assert capped["npstream_group_pulled_messages_total"] == 2
    assert capped["npstream_retained_bytes"] > 0


def _get(url: str, authorization: str | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url)
    if authorization:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read().decode(), dict(reply.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def test_metrics_follow_the_tokens_when_auth_is_on(broker_factory, tmp_path):
    broker = broker_factory("auth", args=write_tokens_file(
        tmp_path / "tokens.toml", "metrics-admin-1f2e", "metrics-reader-7c6b", "a*"))
    with Client(broker.address, token="metrics-admin-1f2e") as client:
        client.publish("a1", b"x")
        client.publish("b1", b"y")
    url = broker.http_address + "/metrics"
    status, _, headers = _get(url)
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Basic")
    assert _get(url, "Bearer wrong-token")[0] == 401

    everything = broker.metrics(token="metrics-admin-1f2e")
    assert {'npstream_stream_end_offset{stream="a1"}',
            'npstream_stream_end_offset{stream="b1"}'} <= set(everything)
    reader = broker.metrics(token="metrics-reader-7c6b")
    assert reader['npstream_stream_end_offset{stream="a1"}'] == 1
    assert not [k for k in reader if 'stream="b1"' in k]
    assert reader["npstream_published_messages_total"] == 2   # totals stay
    for credentials in (":metrics-reader-7c6b", "metrics-reader-7c6b:",
                        "prometheus:metrics-reader-7c6b"):
        basic = "Basic " + base64.b64encode(credentials.encode()).decode()
        status, text, _ = _get(url, basic)
        assert status == 200 and 'stream="a1"' in text and 'stream="b1"' not in text
    assert "metrics-reader-7c6b" not in broker.log_text()
    with Client(broker.address, token="metrics-reader-7c6b") as client:
        assert [a.info.name for a in client.stream_stats().streams] == ["a1"]
        with pytest.raises(PermissionDenied):
            client.stream_stats(streams=["b1"])


def test_metrics_port_serves_https_with_tls(broker_factory, tls_files):
    import ssl

    env = {"NPSTREAM_TLS_CERT_FILE": str(tls_files.server_cert),
           "NPSTREAM_TLS_KEY_FILE": str(tls_files.server_key)}
    broker = broker_factory("tls", env=env)
    assert broker.http_address.startswith("https://127.0.0.1:")
    context = ssl.create_default_context(cafile=str(tls_files.ca))
    with urllib.request.urlopen(broker.http_address + "/metrics", context=context,
                                timeout=10) as reply:
        assert "npstream_streams 0.0" in reply.read().decode()


def test_json_log_format_has_stream_and_group_fields(broker_factory):
    broker = broker_factory("json", args=["--log-format", "json"])
    with Client(broker.address) as client:
        client.publish("j1", b"x")
        client.consumer("j1", "jg").pull()
        client.delete_messages("j1")
    broker.stop()
    records = [json.loads(line) for line in broker.log_text().splitlines()]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    created = [r for r in records if r["message"].startswith("created stream 'j1'")]
    assert created and created[0]["stream"] == "j1"
    group = [r for r in records if r["message"].startswith("created cursor group 'jg'")]
    assert group and (group[0]["stream"], group[0]["group"], group[0]["offset"]) == ("j1", "jg", 0)
    emptied = [r for r in records if r["message"].startswith("deleted all messages of stream")]
    assert emptied and emptied[0]["start_offset"] == 1
    assert any("serving on" in r["message"] for r in records)


def test_docs_list_every_metric_the_broker_exports(broker, client):
    """After the workloads above every family exists; docs/broker.md names each one."""
    import re

    from harness import REPO_ROOT

    text = urllib.request.urlopen(broker.http_address + "/metrics", timeout=10).read().decode()
    families = set(re.findall(r"^# TYPE (npstream_\w+) ", text, re.M))
    assert len(families) > 50
    docs = (REPO_ROOT / "docs" / "broker.md").read_text()
    documented = set(re.findall(r"`(npstream_\w+?)(?:\{[^`]*\})?`", docs))
    assert sorted(families - documented) == []
    assert "npstream_append_latency_seconds" not in families  # renamed, and documented so

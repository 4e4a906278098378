"""Access control against a real broker process: tokens, rights, list filtering, reloads.

One broker (module scope) serves the tests that only read its tokens file;
the reload tests start their own, since they rewrite the file.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from harness import BrokerProcess
from npstream import Client, PermissionDenied, StreamNotFound, Unauthenticated
from npstream.client import group_rpc
from npstream.groups.cursor import start_from_pb
from npstream.proto import metadata_keys, pb, pb_grpc

ADMIN, READER, WRITER, OPS, ROOT = ("admin-0f3c1e", "reader-8d2a9b", "writer-5e7f10",
                                    "ops-c41d77", "root-93aa02")
ADMIN_ENTRY = f"""
[[tokens]]
name = "admin"
token = "{ADMIN}"
admin = ["*"]
read = ["*"]
write = ["*"]
"""
TOKENS = ADMIN_ENTRY + f"""
[[tokens]]
name = "reader"
token = "{READER}"
read = ["orders*"]

[[tokens]]
name = "writer"
token = "{WRITER}"
write = ["orders"]

[[tokens]]
name = "ops"
token = "{OPS}"
admin = ["orders*"]
"""
SECRETS = (ADMIN, READER, WRITER, OPS, ROOT)


def write_tokens(path: Path, text: str) -> None:
    """Replace the file at once (a new inode), as the docs advise."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("access")
    tokens = root / "tokens.toml"
    write_tokens(tokens, TOKENS)
    proc = BrokerProcess(root / "data", args=["--tokens-file", str(tokens),
                                              "--log-level", "DEBUG"],
                         env={"NPSTREAM_AUTH_TOKEN": ROOT}).start()
    with Client(proc.address, ADMIN) as admin:
        for name in ("orders", "orders-eu", "payments", "zeta"):
            admin.create_stream(name, exist_ok=True)
        admin.publish_batch("orders", [{"value": b"o1", "id": "o1"}, {"value": b"o2"}])
        admin.publish("payments", b"p1")
    yield proc
    proc.stop()
    log = proc.log_text()
    leaked = [secret for secret in SECRETS if secret in log]
    assert not leaked, "a token appeared in the broker log (even at DEBUG)"


def connect(broker: BrokerProcess, token: str | None) -> Client:
    return Client(broker.address, token, retry_deadline=0)


def trailing_reason(err: grpc.RpcError) -> str:
    return dict(err.trailing_metadata() or ()).get(metadata_keys.REASON, "")


def test_no_token_or_an_unknown_one_is_unauthenticated(broker):
    for token in (None, "not-a-token", READER + "x"):
        with connect(broker, token) as client, pytest.raises(Unauthenticated):
            client.list_streams()
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.DescribeStream(pb.DescribeStreamRequest(name="orders"), timeout=10,
                                metadata=((metadata_keys.AUTHORIZATION, "Bearer nope"),))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert trailing_reason(info.value) == "ERROR_REASON_UNAUTHENTICATED"


@pytest.mark.parametrize(("token", "name", "call", "stream", "right"), [
    (READER, "reader", lambda c: c.publish("orders", b"x"), "orders", "write"),
    (WRITER, "writer", lambda c: c.fetch("orders", 0), "orders", "read"),
    (WRITER, "writer", lambda c: c.stream_info("orders"), "orders", "read"),
    (READER, "reader", lambda c: c.delete_stream("orders-eu"), "orders-eu", "admin"),
    (READER, "reader", lambda c: c.fetch("payments", 0), "payments", "read"),
    (OPS, "ops", lambda c: c.create_stream("payments-2"), "payments-2", "admin"),
    (READER, "reader", lambda c: c.consumer("orders", "g-seek").seek("earliest"), "orders",
     "admin"),
    (READER, "reader", lambda c: c.delete_group("orders", "g"), "orders", "admin"),
    (WRITER, "writer", lambda c: c.consumer("orders", "g").pull(), "orders", "read"),
    (READER, "reader", lambda c: c.receive("orders", "dl", max_deliver=2), "orders.dlq",
     "write"),
])
def test_a_missing_right_is_permission_denied_naming_stream_and_right(
        broker, token, name, call: Callable[[Client], object], stream, right):
    with connect(broker, token) as client, pytest.raises(PermissionDenied) as info:
        call(client)
    message = str(info.value)
    assert f"token '{name}' lacks the '{right}' right on stream '{stream}'" in message
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert info.value.reason == pb.ERROR_REASON_PERMISSION_DENIED
    assert isinstance(info.value, PermissionError)


def test_the_wire_carries_the_status_and_reason(broker):
    with grpc.insecure_channel(broker.address) as channel, pytest.raises(
            grpc.RpcError) as info:
        pb_grpc.StreamServiceStub(channel).Publish(
            pb.PublishRequest(stream="orders", messages=[pb.Message(value=b"x")]),
            metadata=((metadata_keys.AUTHORIZATION, f"Bearer {READER}"),), timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert trailing_reason(info.value) == "ERROR_REASON_PERMISSION_DENIED"
    assert "'write' right on stream 'orders'" in (info.value.details() or "")


def test_granted_rights_work(broker):
    with connect(broker, WRITER) as writer:
        assert writer.publish("orders", b"w1", id="w1").offset >= 2
        result = writer.publish_batch("orders", [{"value": b"w2"}, {"value": b"w3"}])
        assert len(result.offsets) == 2
    with connect(broker, READER) as reader:
        assert reader.fetch("orders", 0).column("value").to_pylist()[:2] == [b"o1", b"o2"]
        assert sum(b.num_rows for b in reader.read_range("orders", 0, 2)) == 2
        consumer = reader.consumer("orders", "readers")
        assert consumer.pull(limit=2).offsets == [0, 1]
        leases = reader.receive("orders-eu", "shared", max_deliver=0)
        assert leases == []
        assert reader.describe_group("orders", "readers").group == "readers"
        with pytest.raises(StreamNotFound):  # may read orders*: learns it does not exist
            reader.stream_info("orders-missing")
    with connect(broker, OPS) as ops:
        ops.create_stream("orders-ops", exist_ok=True)
        seek = group_rpc.seek(ops, "orders", "readers", start_from_pb("earliest"))
        assert seek.position.committed_offset == 0
        assert ops.delete_stream("orders-ops")
    with connect(broker, ROOT) as root:  # auth_token: every right on every stream
        root.publish("zeta", b"z")
        assert root.fetch("zeta", 0).num_rows == 1
        root.create_stream("root-made")
        assert root.delete_stream("root-made")


def test_list_streams_and_patterns_show_only_readable_streams(broker):
    with connect(broker, READER) as reader:
        assert [s.name for s in reader.list_streams()] == ["orders", "orders-eu"]
        assert [s.name for s in reader.list_streams(pattern="*s")] == ["orders"]
    with connect(broker, WRITER) as writer:
        assert writer.list_streams() == []
    with connect(broker, ADMIN) as admin:
        assert {"orders", "orders-eu", "payments", "zeta"} <= {
            s.name for s in admin.list_streams()}
    reader_auth = ((metadata_keys.AUTHORIZATION, f"Bearer {READER}"),)
    with grpc.insecure_channel(broker.address) as channel:
        streams = pb_grpc.StreamServiceStub(channel)
        names, token = [], ""
        while True:  # pages are cut after filtering: one readable stream per page
            page = streams.ListStreams(pb.ListStreamsRequest(page_size=1, page_token=token),
                                       metadata=reader_auth, timeout=10)
            assert len(page.streams) == 1 or not page.next_page_token
            names += [s.name for s in page.streams]
            token = page.next_page_token
            if not token:
                break
        assert names == ["orders", "orders-eu"]
        ends = streams.EndOffsets(pb.EndOffsetsRequest(pattern="*"), metadata=reader_auth,
                                  timeout=10)
        assert sorted(s.stream for s in ends.streams) == ["orders", "orders-eu"]
        with pytest.raises(grpc.RpcError) as info:
            streams.EndOffsets(pb.EndOffsetsRequest(streams=["orders", "payments"]),
                               metadata=reader_auth, timeout=10)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "stream 'payments'" in (info.value.details() or "")


def test_sink_needs_write_on_every_target_stream(broker):
    rows = pa.table({"value": [b"a", b"b"]})
    with connect(broker, WRITER) as writer:
        sink = writer.sink(local_staging=False)
        sink.stage("job", 0, "t0", "orders", rows)
        routed = pa.table({"value": [b"c", b"d"], "stream": ["orders", "payments"]})
        with pytest.raises(PermissionDenied, match="'write' right on stream 'payments'"):
            sink.stage("job", 0, "t1", "orders", routed)
        sink.stage("job", 0, "t2", "orders", rows)
    with connect(broker, READER) as reader:
        intruder = reader.sink(local_staging=False)
        with pytest.raises(PermissionDenied, match="'write' right on stream 'orders'"):
            intruder.commit("job", 0, ["t0"])
        with pytest.raises(PermissionDenied, match="'write' right on stream 'orders'"):
            intruder.abort("job", 0)
        with pytest.raises(PermissionDenied, match="'write' right on any stream"):
            intruder.commit("job", 1, [])  # names no stream: needs write somewhere
        assert intruder.last_batch_id("job") == -1  # reading a sink's state needs no right
    with connect(broker, WRITER) as writer:
        sink = writer.sink(local_staging=False)
        assert sink.abort("job", 0, ["t2"]) == 1
        committed = sink.commit("job", 0, ["t0"])
        start, end = committed.written["orders"]
        assert end - start == 2


def test_subscribe_needs_read_and_dead_letter_write(broker):
    with connect(broker, WRITER) as writer, pytest.raises(PermissionDenied,
                                                          match="'read' right on stream"):
        writer.subscribe("orders", "subs", lambda lease: lease.ack())
    with connect(broker, ADMIN) as admin:
        admin.create_stream("orders-dead", exist_ok=True)
    with connect(broker, READER) as reader:
        with pytest.raises(PermissionDenied, match="'write' right on stream 'orders-dead'"):
            reader.subscribe("orders", "subs", lambda lease: lease.ack(), max_deliver=3,
                             dead_letter_stream="orders-dead")
        seen: list[bytes] = []
        with reader.subscribe("orders", "subs", lambda lease: seen.append(lease.value)):
            deadline = time.monotonic() + 10
            while len(seen) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert seen[:2] == [b"o1", b"o2"]


# ------------------------------------------------------------ reloads


RELOADABLE = f"""
[[tokens]]
name = "app"
token = "{READER}"
read = ["orders"]
"""


@pytest.fixture
def reloading(broker_factory, tmp_path) -> tuple[BrokerProcess, Path]:
    tokens = tmp_path / "reload.toml"
    write_tokens(tokens, ADMIN_ENTRY + RELOADABLE)
    proc = broker_factory("reload", args=["--tokens-file", str(tokens)])
    with connect(proc, ADMIN) as admin:
        admin.create_stream("orders")
    return proc, tokens


def eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def publishes(client: Client) -> bool:
    try:
        client.publish("orders", b"after-reload")
        return True
    except PermissionDenied:
        return False


def test_sighup_reload_changes_a_live_clients_rights_without_reconnecting(reloading):
    broker, tokens = reloading
    with connect(broker, ADMIN) as admin:
        admin.publish("orders", b"before")
    with connect(broker, READER) as app:
        seen: list[bytes] = []
        subscription = app.subscribe("orders", "live", lambda lease: seen.append(lease.value))
        with subscription:
            assert not publishes(app)
            write_tokens(tokens, RELOADABLE.replace('read = ["orders"]',
                                                    'read = ["orders"]\nwrite = ["orders"]'))
            os.kill(broker.pid, signal.SIGHUP)
            eventually(lambda: publishes(app), "SIGHUP did not grant the write right")
            eventually(lambda: b"after-reload" in seen, "the subscription stopped delivering")
            assert subscription.error is None
        assert seen[0] == b"before"
    log = broker.log_text()
    assert re.search(r"SIGHUP: tokens file \S+ reloaded: 1 token\(s\): app", log)
    assert log.count("subscribed to group 'live'") == 1  # one connection, never dropped
    assert broker.proc is not None and broker.proc.poll() is None  # SIGHUP did not stop it
    assert READER not in log


def test_file_change_reload_and_a_bad_file_keeps_the_old_rights(reloading):
    broker, tokens = reloading
    with connect(broker, READER) as app:
        subscription = app.subscribe("orders", "revoked", lambda lease: lease.ack())
        assert app.fetch("orders", 0) is not None
        write_tokens(tokens, "[[tokens]\nthis is not toml")
        os.kill(broker.pid, signal.SIGHUP)
        eventually(lambda: "tokens file not reloaded" in broker.log_text(),
                   "a bad file was not reported")
        app.fetch("orders", 0)  # the previous table stays in force
        write_tokens(tokens, RELOADABLE.replace('read = ["orders"]', 'read = ["other"]'))

        def denied() -> bool:
            try:
                app.fetch("orders", 0)
                return False
            except PermissionDenied:
                return True

        eventually(denied, "the changed file was not picked up without a signal")
        # A subscription opened before ends once its read right is gone.
        eventually(lambda: subscription.error is not None, "the subscription kept running")
        assert isinstance(subscription.error, PermissionDenied)
        subscription.stop()
    assert re.search(r"ERROR .*tokens file not reloaded, the previous \d token\(s\) stay in force",
                     broker.log_text())
    assert "tokens file changed: tokens file" in broker.log_text()

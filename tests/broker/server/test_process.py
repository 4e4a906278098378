"""The broker process: health, reflection, auth, TLS, metrics, config layers, clean shutdown."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from harness import BrokerProcess
from npstream.proto import pb, pb_grpc

SERVICES = ("npstream.v1.StreamService", "npstream.v1.GroupService", "npstream.v1.SinkService")


def test_health_reports_serving_for_every_service(broker):
    with grpc.insecure_channel(broker.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", *SERVICES):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service


def test_reflection_lists_the_npstream_services(broker):
    with grpc.insecure_channel(broker.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
        names = {s.name for r in replies for s in r.list_services_response.service}
    assert set(SERVICES) <= names
    assert "grpc.health.v1.Health" in names


def test_auth_token_required_except_for_health(broker_factory):
    broker = broker_factory(env={"NPSTREAM_AUTH_TOKEN": "s3cret"})
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        request = pb.CreateStreamRequest(name="guarded")
        for metadata in (None, (("authorization", "Bearer wrong"),),
                         (("authorization", "s3cret"),)):
            with pytest.raises(grpc.RpcError) as info:
                stub.CreateStream(request, metadata=metadata, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "missing or invalid auth token" in info.value.details()
        groups = pb_grpc.GroupServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            groups.ListGroups(pb.ListGroupsRequest(stream="guarded"), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        good = (("authorization", "Bearer s3cret"),)
        assert stub.CreateStream(request, metadata=good, timeout=10).name == "guarded"
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == (
            health_pb2.HealthCheckResponse.SERVING)
    assert "s3cret" not in broker.log_text()


def test_tls_broker_serves_tls_clients_and_rejects_plaintext(broker_factory, tls_files):
    broker = broker_factory(env={"NPSTREAM_TLS_CERT_FILE": str(tls_files.server_cert),
                                 "NPSTREAM_TLS_KEY_FILE": str(tls_files.server_key)})
    assert "tls=on" in broker.log_text()
    credentials = grpc.ssl_channel_credentials(root_certificates=tls_files.ca.read_bytes())
    with grpc.secure_channel(broker.address, credentials) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        reply = stub.Publish(pb.PublishRequest(stream="tls", messages=[pb.Message(value=b"x")]),
                             timeout=10)
        assert reply.stored_count == 1
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.DescribeStream(pb.DescribeStreamRequest(name="tls"), timeout=3)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_broker_accepts_only_clients_with_a_certificate_of_its_ca(broker_factory,
                                                                            tls_files):
    broker = broker_factory(env=tls_files.broker_env)
    assert "tls=on, client certificates required" in broker.log_text()
    root = tls_files.ca.read_bytes()
    request = pb.PublishRequest(stream="mtls", messages=[pb.Message(value=b"x")])
    good = grpc.ssl_channel_credentials(root, tls_files.client_key.read_bytes(),
                                        tls_files.client_cert.read_bytes())
    with grpc.secure_channel(broker.address, good) as channel:
        assert pb_grpc.StreamServiceStub(channel).Publish(request, timeout=10).stored_count == 1
    refused = (grpc.ssl_channel_credentials(root),  # no client certificate
               grpc.ssl_channel_credentials(root, tls_files.stranger_key.read_bytes(),
                                            tls_files.stranger_cert.read_bytes()))
    for credentials in refused:
        with grpc.secure_channel(broker.address, credentials) as channel:
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.StreamServiceStub(channel).Publish(request, timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert broker.proc is not None and broker.proc.poll() is None


def test_non_loopback_bind_without_auth_or_tls_refuses_to_start(broker_factory):
    with pytest.raises(RuntimeError) as info:
        broker_factory("open", args=["--host", "0.0.0.0"])
    assert "broker exited with 2" in str(info.value)
    assert "refusing to listen on '0.0.0.0'" in str(info.value)
    assert "allow_insecure = true" in str(info.value)


def test_allow_insecure_starts_on_every_interface_and_warns(broker_factory):
    broker = broker_factory("open", args=["--host", "0.0.0.0", "--allow-insecure"])
    assert "serving without authentication or TLS" in broker.log_text()
    with grpc.insecure_channel(broker.address) as channel:  # 127.0.0.1 is among them
        stub = pb_grpc.StreamServiceStub(channel)
        assert stub.CreateStream(pb.CreateStreamRequest(name="open"), timeout=10).name == "open"
    token_broker = broker_factory("guarded", args=["--host", "0.0.0.0"],
                                  env={"NPSTREAM_AUTH_TOKEN": "s3cret"})
    assert "serving without authentication" not in token_broker.log_text()


def test_a_tokens_file_that_does_not_parse_refuses_the_start(broker_factory, tmp_path):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[[tokens]]\ntoken = "secret-never-shown"\nreed = ["*"]\n')
    with pytest.raises(RuntimeError) as info:
        broker_factory("bad-tokens", args=["--tokens-file", str(tokens)])
    assert "broker exited with 1" in str(info.value)
    assert "unknown key(s) ['reed']" in str(info.value)
    assert "secret-never-shown" not in str(info.value)


def test_metrics_count_publishes_and_fetches_and_sigterm_exits_zero(broker_factory):
    broker = broker_factory()
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        stub.Publish(pb.PublishRequest(stream="m", messages=[pb.Message(value=b"abc")] * 3))
        stub.Fetch(pb.FetchRequest(stream="m", offset=0))
        with pytest.raises(grpc.RpcError):
            stub.Fetch(pb.FetchRequest(stream="m", offset=99))
    samples = broker.metrics()
    assert samples["npstream_publish_requests_total"] == 1
    assert samples["npstream_published_messages_total"] == 3
    assert samples["npstream_published_bytes_total"] > 0
    assert samples["npstream_fetch_requests_total"] == 1
    assert samples["npstream_fetched_messages_total"] == 3
    assert samples["npstream_fetched_bytes_total"] > 0
    assert samples['npstream_publish_latency_seconds_count{ack="fsync"}'] == 1
    assert samples["npstream_streams"] == 1
    assert samples['npstream_stream_end_offset{stream="m"}'] == 3
    assert samples['npstream_rpc_errors_total{code="OUT_OF_RANGE"}'] == 1
    assert broker.stop() == 0
    log = broker.log_text()
    assert re.search(r"serving on 127\.0\.0\.1:\d+ .*data_dir=\S+ metrics=http://", log)
    assert "npstream broker stopped" in log


def test_sigterm_during_long_poll_finishes_the_call_and_exits_zero(broker_factory):
    broker = broker_factory()
    result: dict[str, object] = {}
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        stub.CreateStream(pb.CreateStreamRequest(name="lp"))

        def poll() -> None:
            try:
                result["reply"] = stub.Fetch(pb.FetchRequest(stream="lp", offset=0,
                                                             wait_ms=60_000))
            except grpc.RpcError as exc:
                result["error"] = exc

        thread = threading.Thread(target=poll)
        thread.start()
        time.sleep(0.3)
        started = time.monotonic()
        assert broker.stop() == 0
        thread.join(10)
    assert time.monotonic() - started < 5
    reply = result.get("reply")
    assert isinstance(reply, pb.FetchResponse), result
    assert (reply.count, reply.next_offset) == (0, 0)


def test_config_layers_file_then_env_then_cli_apply_in_a_real_broker(broker_factory,
                                                                      tmp_path):
    config = tmp_path / "broker.toml"
    config.write_text(
        '[server]\nlog_level = "ERROR"\n'
        '[streams]\nauto_create_streams = false\ndefault_max_message_bytes = "2KiB"\n'
    )
    broker = broker_factory(
        config=config,
        env={"NPSTREAM_DEFAULT_MAX_MESSAGE_BYTES": "4KiB", "NPSTREAM_LOG_LEVEL": "ERROR"},
        args=["--log-level", "INFO"],
    )
    assert "serving on" in broker.log_text()  # INFO from the CLI beat ERROR from env/file
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:  # auto_create_streams=false from the file
            stub.Publish(pb.PublishRequest(stream="absent", messages=[pb.Message(value=b"x")]))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert info.value.details() == "stream 'absent' does not exist"
        info_reply = stub.CreateStream(pb.CreateStreamRequest(name="present"))
        assert info_reply.config.max_message_bytes == 4096  # env beat the file
        assert stub.Publish(pb.PublishRequest(stream="present", messages=[
            pb.Message(value=b"x")])).stored_count == 1


def test_unknown_config_key_stops_startup_naming_the_key(broker_factory, tmp_path):
    config = tmp_path / "broker.toml"
    config.write_text("[storage]\nmax_open_file = 64\n")
    with pytest.raises(RuntimeError) as info:
        broker_factory(config=config)
    assert "broker exited with 2" in str(info.value)
    assert "unknown key 'max_open_file' in [storage]" in str(info.value)


def test_second_broker_on_same_data_dir_refuses_to_start(broker_factory):
    first = broker_factory("shared")
    second = BrokerProcess(Path(first.data_dir))
    with pytest.raises(RuntimeError) as info:
        second.start()
    assert "broker exited with 1" in str(info.value)
    assert f"data dir {first.data_dir} is in use by another broker (pid {first.pid})" in str(
        info.value)


def test_retention_thread_removes_expired_segments_on_its_interval(broker_factory):
    broker = broker_factory(env={"NPSTREAM_RETENTION_CHECK_INTERVAL": "100ms",
                                 "NPSTREAM_SEGMENT_BYTES": "1KiB"})
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        stub.CreateStream(pb.CreateStreamRequest(name="short", config=pb.StreamConfig(
            max_age_ms=500)))
        stub.CreateStream(pb.CreateStreamRequest(name="forever", config=pb.StreamConfig(
            max_age_ms=0)))
        for stream in ("short", "forever"):
            for i in range(5):  # 2 KB each: one segment per message
                stub.Publish(pb.PublishRequest(stream=stream, messages=[
                    pb.Message(value=bytes([i]) * 2000)]))
        deadline = time.monotonic() + 15
        info = stub.DescribeStream(pb.DescribeStreamRequest(name="short"))
        while info.start_offset < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
            info = stub.DescribeStream(pb.DescribeStreamRequest(name="short"))
        assert info.start_offset >= 4 and info.end_offset == 5
        kept = stub.DescribeStream(pb.DescribeStreamRequest(name="forever"))
        assert (kept.start_offset, kept.end_offset, kept.segment_count) == (0, 5, 5)


def test_request_over_grpc_max_message_bytes_is_resource_exhausted(broker_factory):
    broker = broker_factory(env={"NPSTREAM_GRPC_MAX_MESSAGE_BYTES": "4MiB",
                                 "NPSTREAM_DEFAULT_MAX_MESSAGE_BYTES": "1MiB",
                                 "NPSTREAM_MAX_BATCH_BYTES": "1MiB"})
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        big = [pb.Message(value=b"x" * (512 << 10))] * 10  # 5 MiB request
        with pytest.raises(grpc.RpcError) as info:
            stub.Publish(pb.PublishRequest(stream="big", messages=big), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        reply = stub.Publish(pb.PublishRequest(stream="big", messages=big[:6]), timeout=10)
        assert reply.stored_count == 6
        # A fetch reply stays under the limit: it is filled to at most half of it.
        options = [("grpc.max_receive_message_length", 64 << 20)]
        with grpc.insecure_channel(broker.address, options=options) as reader:
            fetched = pb_grpc.StreamServiceStub(reader).Fetch(
                pb.FetchRequest(stream="big", offset=0, max_bytes=64 << 20), timeout=10)
        assert fetched.ByteSize() <= 4 << 20
        assert fetched.count >= 1

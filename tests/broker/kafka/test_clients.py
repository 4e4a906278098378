"""Real Kafka clients (kafka-python, confluent-kafka) against one broker's Kafka port:
what they produce is exactly what the SDK fetches, and what anyone wrote they consume."""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest

from harness import BrokerProcess
from npstream import Client
from npstream.broker.kafka.codec import Reader, Writer, load_schema
from npstream.broker.kafka.records import encode_batch
from npstream.proto.schema import HEADERS_TYPE, MESSAGE_SCHEMA

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

kafka = pytest.importorskip("kafka")

MESSAGES = [(f"k{i}".encode(), f"value {i}".encode() * (i + 1),
             [("trace", f"t{i}".encode()), ("n", str(i).encode())]) for i in range(20)]


@pytest.fixture(scope="module")
def kbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("kafka") / "data",
                         args=["--kafka-port", "auto"]).start()
    yield proc
    proc.stop()


def _stored(broker: BrokerProcess, topic: str) -> list[tuple]:
    with Client(broker.address) as client:
        table = client.fetch(topic, 0, max_messages=1000)
    return [(row["offset"], row["key"], row["value"], sorted(row["headers"] or []))
            for row in table.to_pylist()]


def _expected(first: int = 0) -> list[tuple]:
    return [(first + i, k, v, sorted(h)) for i, (k, v, h) in enumerate(MESSAGES)]


# kafka-python compresses snappy and lz4 only with python-snappy and lz4 installed;
# librdkafka (below) has every codec built in.
@pytest.mark.parametrize("compression", [None, "gzip", "zstd"])
def test_kafka_python_produce_keyed_with_headers_stored_exactly(kbroker, compression):
    topic = f"kp-{compression}"
    producer = kafka.KafkaProducer(bootstrap_servers=kbroker.kafka_address, acks="all",
                                   compression_type=compression, linger_ms=5)
    futures = [producer.send(topic, key=k, value=v, headers=h) for k, v, h in MESSAGES]
    producer.flush(timeout=30)
    offsets = [f.get(timeout=30).offset for f in futures]
    producer.close()
    assert offsets == list(range(len(MESSAGES)))
    assert _stored(kbroker, topic) == _expected()


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_produce_keyed_with_headers_stored_exactly(kbroker, compression):
    topic = f"ck-{compression}"
    producer = confluent_kafka.Producer({"bootstrap.servers": kbroker.kafka_address,
                                         "acks": "all", "compression.type": compression,
                                         "enable.idempotence": False, "linger.ms": 5})
    reports: list[tuple[object, int]] = []
    for k, v, h in MESSAGES:
        producer.produce(topic, key=k, value=v, headers=h,
                         on_delivery=lambda err, msg: reports.append((err, msg.offset())))
    assert producer.flush(30) == 0
    assert reports == [(None, i) for i in range(len(MESSAGES))]
    assert _stored(kbroker, topic) == _expected()


def _sdk_publish(broker: BrokerProcess, topic: str) -> None:
    with Client(broker.address) as client:
        for k, v, h in MESSAGES:
            client.publish(topic, v, key=k, headers=dict(h))


def test_kafka_python_consume_assigned_partition_reads_sdk_messages_exactly(kbroker):
    topic = "sdk-to-kp"
    _sdk_publish(kbroker, topic)
    consumer = kafka.KafkaConsumer(bootstrap_servers=kbroker.kafka_address,
                                   enable_auto_commit=False, group_id=None,
                                   consumer_timeout_ms=10_000)
    partition = kafka.TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek(partition, 0)
    got = []
    for message in consumer:
        got.append((message.offset, message.key, message.value, sorted(message.headers)))
        if len(got) == len(MESSAGES):
            break
    consumer.close()
    assert got == _expected()


def _confluent_read(broker: BrokerProcess, topic: str, offset: int) -> list[tuple]:
    """Messages from ``offset`` to the end of MESSAGES, partition 0 assigned (no group)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": broker.kafka_address,
                                         "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, offset)])
    got: list[tuple] = []
    for _ in range(100):
        message = consumer.poll(1.0)
        if message is None:
            continue
        assert message.error() is None, message.error()
        got.append((message.offset(), message.key(), message.value(),
                    sorted(message.headers() or [])))
        if len(got) == len(MESSAGES) - offset:
            break
    consumer.close()
    return got


def test_confluent_consume_assigned_partition_reads_sdk_messages_exactly(kbroker):
    _sdk_publish(kbroker, "sdk-to-ck")
    assert _confluent_read(kbroker, "sdk-to-ck", 0) == _expected()


def test_confluent_consume_from_middle_of_stored_batch_starts_at_that_offset(kbroker):
    topic = "mid-batch"
    rows = pa.table({"value": [v for _, v, _ in MESSAGES], "key": [k for k, _, _ in MESSAGES],
                     "headers": pa.array([h for _, _, h in MESSAGES], HEADERS_TYPE)})
    with Client(kbroker.address) as client:
        client.publish_batch(topic, rows)
        assert len(client.fetch_batches(topic, 0)[0]) == 1  # one stored batch holds them all
    assert _confluent_read(kbroker, topic, 7) == _expected()[7:]


def test_list_offsets_earliest_latest_by_timestamp_match_stream(kbroker):
    topic = "offsets"
    _sdk_publish(kbroker, topic)
    consumer = kafka.KafkaConsumer(bootstrap_servers=kbroker.kafka_address)
    partition = kafka.TopicPartition(topic, 0)
    assert consumer.beginning_offsets([partition]) == {partition: 0}
    assert consumer.end_offsets([partition]) == {partition: len(MESSAGES)}
    with Client(kbroker.address) as client:
        stamp = client.fetch(topic, 5, max_messages=1).column("timestamp")[0].value
    found = consumer.offsets_for_times({partition: stamp})[partition]
    assert found.offset <= 5 and found.timestamp == stamp
    assert consumer.offsets_for_times({partition: 2**62})[partition] is None
    consumer.close()


def test_fetch_at_end_long_polls_then_delivers_new_message(kbroker):
    with Client(kbroker.address) as client:
        client.publish("tail", b"first")
        consumer = confluent_kafka.Consumer({"bootstrap.servers": kbroker.kafka_address,
                                             "group.id": "unused", "fetch.wait.max.ms": 5000,
                                             "enable.auto.commit": False})
        consumer.assign([confluent_kafka.TopicPartition("tail", 0, 1)])
        assert consumer.poll(1.0) is None
        client.publish("tail", b"late")
        started = time.monotonic()
        message = None
        while message is None and time.monotonic() - started < 10:
            message = consumer.poll(0.1)
        waited = time.monotonic() - started
    consumer.close()
    assert message is not None and (message.offset(), message.value()) == (1, b"late")
    assert waited < 3  # woken by the append, not at the end of fetch.wait.max.ms (5 s)


def _raw_call(address: str, frame: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", sock.recv(4))[0]
        data = b""
        while len(data) < size:
            data += sock.recv(size - len(data))
        return data


def test_api_versions_unknown_version_answered_v0_unsupported_version(kbroker):
    # ApiVersions v99, correlation 42, client id "x": KIP-511's fallback.
    reply = _raw_call(kbroker.kafka_address, struct.pack(">hhih", 18, 99, 42, 1) + b"x")
    correlation, error, count = struct.unpack(">ihi", reply[:10])
    assert (correlation, error) == (42, 35)
    keys = {struct.unpack(">hhh", reply[10 + 6 * i:16 + 6 * i])[0] for i in range(count)}
    assert keys == {0, 1, 2, 3, 18}


def test_oversized_frame_closes_connection_and_broker_keeps_serving(kbroker):
    host, port = kbroker.kafka_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">i", 2**31 - 1) + b"junk")
        assert sock.recv(10) == b""
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">i", 3) + b"\x00\x03\x00")  # truncated header
        assert sock.recv(10) == b""
    reply = _raw_call(kbroker.kafka_address, struct.pack(">hhih", 18, 0, 7, -1))
    assert struct.unpack(">ih", reply[:6]) == (7, 0)


def test_metadata_topic_id_stable_and_bad_name_invalid_topic(kbroker):
    admin = AdminClient({"bootstrap.servers": kbroker.kafka_address})
    _sdk_publish(kbroker, "ids")
    first = admin.list_topics("ids", timeout=10).topics["ids"]
    assert first.error is None and list(first.partitions) == [0]
    bad = admin.list_topics("bad name!", timeout=10).topics["bad name!"]
    assert bad.error is not None and bad.error.code() == 17


def test_produce_bad_crc_corrupt_message_and_nothing_stored(kbroker):
    _sdk_publish(kbroker, "guarded")
    with Client(kbroker.address) as client:
        batch = bytearray(encode_batch(client.fetch("guarded", 0).cast(MESSAGE_SCHEMA)))
    batch[-1] ^= 0xFF  # the last record's last byte: the CRC no longer matches
    w = Writer()
    load_schema("RequestHeader").write(w, {"RequestApiKey": 0, "RequestApiVersion": 3,
                                           "CorrelationId": 5, "ClientId": "raw"}, 1)
    load_schema("ProduceRequest").write(w, {
        "TransactionalId": None, "Acks": -1, "TimeoutMs": 5000, "TopicData": [
            {"Name": "guarded", "PartitionData": [{"Index": 0, "Records": bytes(batch)}]}]}, 3)
    reply = _raw_call(kbroker.kafka_address, bytes(w))
    assert struct.unpack(">i", reply[:4])[0] == 5
    body = load_schema("ProduceResponse").decode(Reader(reply[4:]), 3)
    partition = body["Responses"][0]["PartitionResponses"][0]
    assert (partition["ErrorCode"], partition["BaseOffset"]) == (2, -1)
    assert len(_stored(kbroker, "guarded")) == len(MESSAGES)


def _topic_id(broker: BrokerProcess, topic: str) -> uuid.UUID:
    w = Writer()
    load_schema("RequestHeader").write(w, {"RequestApiKey": 3, "RequestApiVersion": 12,
                                           "CorrelationId": 1, "ClientId": "raw"}, 2)
    load_schema("MetadataRequest").write(w, {"Topics": [{"Name": topic}],
                                             "AllowAutoTopicCreation": False}, 12)
    reply = _raw_call(broker.kafka_address, bytes(w))
    body = load_schema("MetadataResponse").decode(Reader(reply[5:]), 12)  # header v1
    (entry,) = body["Topics"]
    assert entry["ErrorCode"] == 0
    return entry["TopicId"]


def test_metadata_topic_id_same_after_restart_new_after_recreate(broker_factory):
    proc = broker_factory("ids", args=["--kafka-port", "auto"])
    _sdk_publish(proc, "ids")
    first = _topic_id(proc, "ids")
    proc.restart()
    assert _topic_id(proc, "ids") == first != uuid.UUID(int=0)
    with Client(proc.address) as client:
        client.delete_stream("ids")
    _sdk_publish(proc, "ids")
    assert _topic_id(proc, "ids") != first


def test_broker_with_auth_and_kafka_port_refuses_to_start_naming_kafka_port(tmp_path):
    proc = BrokerProcess(tmp_path / "data", args=["--kafka-port", "auto"],
                         env={"NPSTREAM_AUTH_TOKEN": "secret"})
    with pytest.raises(RuntimeError, match=r"broker exited with 1"):
        proc.start(timeout=60)
    assert "cannot start: [kafka] port is set with auth or TLS on" in proc.log_text()

"""The schema-driven Kafka codec: every served API round-trips at its lowest and
highest version, headers frame as Kafka's clients expect, and hostile request
frames give a CodecError, never another exception."""

from __future__ import annotations

import contextlib
import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npstream.broker.kafka.codec import Reader, Writer, load_schema
from npstream.broker.kafka.errors import CodecError
from npstream.broker.kafka.protocol import SERVED, decode_body, decode_request, encode_response

# One request and one response per served API, using fields of every kind the
# schemas have (nested arrays, nullable strings, uuids, records, tagged fields).
REQUESTS = {
    "Produce": {"TransactionalId": None, "Acks": -1, "TimeoutMs": 3000, "TopicData": [
        {"Name": "orders", "PartitionData": [{"Index": 0, "Records": b"\x01\x02\x03"}]}]},
    "Fetch": {"ReplicaId": -1, "MaxWaitMs": 500, "MinBytes": 1, "MaxBytes": 1 << 20,
              "IsolationLevel": 0, "SessionId": 0, "SessionEpoch": -1, "Topics": [
                  {"Topic": "orders", "TopicId": uuid.UUID(int=7), "Partitions": [
                      {"Partition": 0, "CurrentLeaderEpoch": -1, "FetchOffset": 42,
                       "LastFetchedEpoch": -1, "LogStartOffset": -1,
                       "PartitionMaxBytes": 1 << 20}]}],
              "ForgottenTopicsData": [], "RackId": "", "ClusterId": "c1"},
    "ListOffsets": {"ReplicaId": -1, "IsolationLevel": 0, "Topics": [
        {"Name": "orders", "Partitions": [
            {"PartitionIndex": 0, "CurrentLeaderEpoch": -1, "Timestamp": -2}]}]},
    "Metadata": {"Topics": [{"TopicId": uuid.UUID(int=0), "Name": "orders"}],
                 "AllowAutoTopicCreation": True},
    "ApiVersions": {"ClientSoftwareName": "kafka-python", "ClientSoftwareVersion": "2.0"},
}
RESPONSES = {
    "Produce": {"Responses": [{"Name": "orders", "PartitionResponses": [
        {"Index": 0, "ErrorCode": 0, "BaseOffset": 10, "LogAppendTimeMs": -1,
         "LogStartOffset": 0, "RecordErrors": [], "ErrorMessage": None}]}],
        "ThrottleTimeMs": 0},
    "Fetch": {"ThrottleTimeMs": 0, "ErrorCode": 0, "SessionId": 0, "Responses": [
        {"Topic": "orders", "TopicId": uuid.UUID(int=7), "Partitions": [
            {"PartitionIndex": 0, "ErrorCode": 0, "HighWatermark": 43,
             "LastStableOffset": 43, "LogStartOffset": 0, "AbortedTransactions": None,
             "PreferredReadReplica": -1, "Records": b"batch"}]}]},
    "ListOffsets": {"ThrottleTimeMs": 0, "Topics": [{"Name": "orders", "Partitions": [
        {"PartitionIndex": 0, "ErrorCode": 0, "Timestamp": -1, "Offset": 43,
         "LeaderEpoch": 0}]}]},
    "Metadata": {"ThrottleTimeMs": 0, "Brokers": [
        {"NodeId": 0, "Host": "127.0.0.1", "Port": 9092, "Rack": None}],
        "ClusterId": "npstream", "ControllerId": 0, "Topics": [
            {"ErrorCode": 0, "Name": "orders", "TopicId": uuid.UUID(int=9),
             "IsInternal": False, "Partitions": [
                 {"ErrorCode": 0, "PartitionIndex": 0, "LeaderId": 0, "LeaderEpoch": 0,
                  "ReplicaNodes": [0], "IsrNodes": [0], "OfflineReplicas": []}]}]},
    "ApiVersions": {"ErrorCode": 0, "ApiKeys": [
        {"ApiKey": 18, "MinVersion": 0, "MaxVersion": 4}], "ThrottleTimeMs": 0},
}


def _subset(expected: object, actual: object, version: int, path: str = "") -> None:
    """Every field the version carries comes back equal (absent ones read as defaults)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), path
        for key, value in expected.items():
            _subset(value, actual[key], version, f"{path}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), path
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            _subset(e, a, version, f"{path}[{i}]")


def _present(schema_name: str, message: dict, version: int) -> dict:
    """The message as it reads back at ``version``: fields of other versions at defaults."""
    schema = load_schema(schema_name)
    return schema.decode(Reader(schema.encode(message, version)), version)


@pytest.mark.parametrize("key", sorted(SERVED))
@pytest.mark.parametrize("edge", ["min", "max"])
def test_request_and_response_roundtrip_at_served_edges_equal(key, edge):
    api = SERVED[key]
    version = api.min_version if edge == "min" else api.max_version
    for kind, samples in (("Request", REQUESTS), ("Response", RESPONSES)):
        schema = load_schema(f"{api.name}{kind}")
        once = _present(f"{api.name}{kind}", samples[api.name], version)
        encoded = schema.encode(once, version)
        assert schema.decode(Reader(encoded), version) == once
        assert schema.encode(schema.decode(Reader(encoded), version), version) == encoded
        for name, field in ((f.name, f) for f in schema.fields):
            if version in field.versions and not (version in schema.flexible
                                                  and version in field.tagged):
                assert once[name] == _present(f"{api.name}{kind}", once, version)[name]


def _frame(key: int, version: int, body: dict, client_id: str | None = "test") -> bytes:
    api = SERVED[key]
    w = Writer()
    header = load_schema("RequestHeader")
    header.write(w, {"RequestApiKey": key, "RequestApiVersion": version,
                     "CorrelationId": 77, "ClientId": client_id},
                 2 if api.flexible(version) else 1)
    api.request.write(w, body, version)
    return bytes(w)


@pytest.mark.parametrize("version", [0, 3, 4])
def test_decode_request_reads_header_and_body_at_each_apiversions_version(version):
    frame = decode_request(_frame(18, version, REQUESTS["ApiVersions"]))
    assert (frame.api_key, frame.api_version, frame.correlation_id, frame.client_id) == (
        18, version, 77, "test")
    body = decode_body(SERVED[18], frame)
    expected = "kafka-python" if version >= 3 else ""
    assert body["ClientSoftwareName"] == expected


def test_encode_response_apiversions_v3_uses_header_v0_flexible_body():
    out = encode_response(SERVED[18], 3, 5, RESPONSES["ApiVersions"])
    size, correlation = struct.unpack(">ii", out[:8])
    assert size == len(out) - 4 and correlation == 5
    # header v0: the body follows the correlation id at once (error code 0, compact array of 1)
    assert out[8:12] == b"\x00\x00\x02\x00"


def test_encode_response_flexible_metadata_has_header_tagged_fields():
    out = encode_response(SERVED[3], 12, 9, RESPONSES["Metadata"])
    assert struct.unpack(">i", out[4:8])[0] == 9 and out[8] == 0  # empty header tag section


def test_decode_request_null_topics_array_where_not_nullable_codec_error():
    body = struct.pack(">hhih", 0, 3, 1, -1) + struct.pack(">hhii", -1, -1, 1000, -1)
    with pytest.raises(CodecError, match="TopicData: null array"):
        decode_body(SERVED[0], decode_request(body))


def test_writer_reader_varints_roundtrip_extremes():
    for value in (0, 1, -1, 63, -64, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)):
        w = Writer()
        w.varint(value)
        assert Reader(bytes(w)).varint() == value


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300))
def test_decode_request_garbage_raises_only_codec_error(data):
    try:
        frame = decode_request(data)
        api = SERVED.get(frame.api_key)
        if api is not None and api.min_version <= frame.api_version <= api.max_version:
            decode_body(api, frame)
    except CodecError:
        pass


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(sorted(SERVED)), cut=st.integers(min_value=0, max_value=400),
       flip=st.integers(min_value=0, max_value=400), byte=st.integers(0, 255))
def test_decode_request_truncated_or_corrupted_raises_only_codec_error(key, cut, flip, byte):
    api = SERVED[key]
    for version in (api.min_version, api.max_version):
        frame = bytearray(_frame(key, version, REQUESTS[api.name]))
        if flip < len(frame):
            frame[flip] = byte
        with contextlib.suppress(CodecError):
            decode_body(api, decode_request(bytes(frame[:cut])))

"""The cluster's rules without processes: placement, configuration, which RPC is routed how.

The brokers themselves, three of them on loopback, are exercised in
tests/e2e/broker_cluster/test_broker_cluster.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor_pb2 import FieldDescriptorProto

from npstream.broker.cluster.fanout import FANOUT_METHODS
from npstream.broker.cluster.interceptor import MEMBER_METHODS, PER_STREAM, STREAMING
from npstream.broker.cluster.placement import placement_weight, rendezvous_owner
from npstream.broker.server.config import ConfigError, load_config
from npstream.client.routing import stream_of
from npstream.proto import pb
from npstream.proto.routing import PER_STREAM_METHODS, STREAM_FIELDS, stream_path
from npstream.proto.wire import field_bytes

MEMBERS = ["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"]


# ---------------------------------------------------------------- placement

def test_placement_is_stable_across_processes_and_versions():
    """The weights are BLAKE2b digests, never Python's salted hash(): pinned values."""
    assert placement_weight("10.0.0.1:7070", "orders") == 3752216530745100468
    assert [rendezvous_owner(name, MEMBERS) for name in ("orders", "payments", "ai_chat_42")] \
        == [rendezvous_owner(name, list(reversed(MEMBERS)))
            for name in ("orders", "payments", "ai_chat_42")]
    pinned = {name: rendezvous_owner(name, MEMBERS) for name in ("orders", "payments", "a")}
    assert pinned == {"orders": "10.0.0.3:7070", "payments": "10.0.0.1:7070",
                      "a": "10.0.0.1:7070"}


def test_placement_spreads_names_evenly():
    counts = Counter(rendezvous_owner(f"sensor-{i}", MEMBERS) for i in range(6000))
    assert set(counts) == set(MEMBERS)
    assert all(1700 < count < 2300 for count in counts.values()), counts


def test_adding_a_member_moves_only_names_to_the_new_member():
    names = [f"chat-{i}" for i in range(4000)]
    before = {name: rendezvous_owner(name, MEMBERS) for name in names}
    grown = [*MEMBERS, "10.0.0.4:7070"]
    after = {name: rendezvous_owner(name, grown) for name in names}
    moved = [name for name in names if before[name] != after[name]]
    assert all(after[name] == "10.0.0.4:7070" for name in moved)
    assert 800 < len(moved) < 1200  # about a quarter


# ---------------------------------------------------------------- configuration

def test_etcd_from_toml_list_env_string_or_flag(tmp_path):
    toml = tmp_path / "broker.toml"
    toml.write_text('[cluster]\netcd = ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]\n')
    config = load_config(toml, env={})
    assert config.cluster.etcd == ("http://10.0.0.1:2379", "http://10.0.0.2:2379")
    assert config.cluster.enabled
    env = load_config(None, env={"NPSTREAM_ETCD": "http://a:2379, http://b:2379"})
    assert env.cluster.etcd == ("http://a:2379", "http://b:2379")
    flag = load_config(None, env={}, cli={"etcd": "http://a:2379", "advertised_address": "b:1"})
    assert (flag.cluster.etcd, flag.cluster.advertised_address) == (("http://a:2379",), "b:1")


def test_no_etcd_is_no_cluster():
    config = load_config(None, env={})
    assert not config.cluster.enabled and config.cluster.etcd == ()


@pytest.mark.parametrize(("where", "value"), [
    ("env", {"NPSTREAM_MEMBERS": "127.0.0.1:7070,127.0.0.1:7071"}),
    ("toml", '[cluster]\nmembers = ["127.0.0.1:7070"]\n'),
])
def test_static_members_are_refused_pointing_to_etcd(tmp_path, where, value):
    toml = None
    if where == "toml":
        toml = tmp_path / "broker.toml"
        toml.write_text(value)
    with pytest.raises(ConfigError, match=r"\[cluster\] members \(--cluster-members, "
                                          r"NPSTREAM_MEMBERS\) is gone: .* start each broker "
                                          r"with --etcd http://HOST:2379"):
        load_config(toml, env=value if where == "env" else {})


def test_cluster_members_flag_fails_pointing_to_etcd():
    result = subprocess.run([sys.executable, "-m", "npstream.broker", "--cluster-members",
                             "127.0.0.1:7070"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "start each broker with --etcd http://HOST:2379" in result.stderr


@pytest.mark.parametrize(("cli", "expected"), [
    ({"etcd": "http://127.0.0.1:2379", "host": "0.0.0.0", "allow_insecure": True},
     "set advertised_address"),
    ({"advertised_address": "127.0.0.1:7070"}, r"\[cluster\] etcd is not"),
    ({"etcd": "http://127.0.0.1:2379", "advertised_address": "nohost"},
     "'nohost' is not host:port"),
    ({"etcd": "http://127.0.0.1:2379", "advertised_address": "0.0.0.0:7071"}, "wildcard"),
    ({"etcd": "http://127.0.0.1:2379", "peer_timeout": "0s"}, "peer_timeout"),
])
def test_bad_cluster_settings_are_refused_saying_why(cli, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(None, env={}, cli=cli)


# ---------------------------------------------------------------- which RPC is routed how

def _all_methods() -> set[str]:
    return {f"/npstream.v1.{service.name}/{method.name}"
            for service in pb.DESCRIPTOR.services_by_name.values()
            for method in service.methods}


def test_every_rpc_is_routed_fanned_out_or_a_members_own():
    """A new RPC must be put in one group, or it would skip routing unnoticed."""
    groups = [set(PER_STREAM), set(STREAMING), FANOUT_METHODS, MEMBER_METHODS]
    every = _all_methods()
    for method in every:
        assert sum(method in group for group in groups) == 1, method
    assert set().union(*groups) == every


def test_the_routed_rpcs_are_those_whose_request_marks_its_stream_in_the_proto():
    """The (names_stream) option decides; the broker's groups are read from it."""
    per_stream = {f"/npstream.v1.{rpc}" for rpc in (
        "StreamService/CreateStream", "StreamService/DescribeStream",
        "StreamService/UpdateStream", "StreamService/DeleteStream",
        "StreamService/DeleteMessages", "StreamService/RepairStream", "StreamService/Publish",
        "StreamService/Fetch", "StreamService/OffsetForTimestamp",
        "StreamReadService/Locate", "StreamReadService/ReadRange",
        "GroupService/OpenConsumer", "GroupService/Pull", "GroupService/Commit",
        "GroupService/Seek", "GroupService/ListGroups", "GroupService/DescribeGroup",
        "GroupService/DeleteGroup", "GroupService/Receive", "GroupService/ReceiveBatch",
        "GroupService/Ack", "GroupService/Nack", "ClusterService/MoveStream")}
    assert set(PER_STREAM) == per_stream
    assert set(PER_STREAM_METHODS) == per_stream | set(STREAMING)
    assert STREAMING == {"/npstream.v1.StreamService/PublishStream": ((1,), True),
                         "/npstream.v1.GroupService/Subscribe": ((1, 1), False),
                         "/npstream.v1.GroupService/SubscribeBatches": ((1, 1), False)}
    by_name = {"CreateStream", "DescribeStream", "UpdateStream", "DeleteStream",
               "DeleteMessages", "RepairStream"}
    for path, numbers in PER_STREAM.items():
        method = PER_STREAM_METHODS[path]
        assert numbers == (1,)
        expected = "name" if path.rpartition("/")[2] in by_name else "stream"
        assert method.field_names == (expected,), path


def test_the_client_routes_the_calls_the_broker_routes():
    """The SDK's stream_of reads the field the broker routes by, from the same declaration."""
    descriptors = {f"/npstream.v1.{service.name}/{method.name}": method
                   for service in pb.DESCRIPTOR.services_by_name.values()
                   for method in service.methods}
    for path in PER_STREAM:
        request_class = getattr(pb, descriptors[path].input_type.name)
        field = PER_STREAM_METHODS[path].field_names[0]
        assert stream_of(request_class(**{field: "orders"})) == "orders", path
        assert stream_of(request_class()) is None, path
    for path in set(FANOUT_METHODS) | MEMBER_METHODS:
        request_class = getattr(pb, descriptors[path].input_type.name)
        assert request_class not in STREAM_FIELDS, path
    assert stream_of(pb.MoveInRequest(stream="orders")) is None  # a member's own call


def test_a_marked_field_that_is_not_a_stream_name_fails_the_import():
    bad = descriptor_pb2.FileDescriptorProto(name="bad_routing.proto", package="bad",
                                             dependency=["npstream/v1/npstream.proto"])
    message = bad.message_type.add(name="Bad")
    field = message.field.add(name="count", number=1, type=FieldDescriptorProto.TYPE_INT64,
                              label=FieldDescriptorProto.LABEL_OPTIONAL)
    field.options.Extensions[pb.names_stream] = True
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(descriptor_pb2.DescriptorProto.DESCRIPTOR.file.serialized_pb)
    pool.AddSerializedFile(pb.DESCRIPTOR.serialized_pb)
    pool.Add(bad)
    with pytest.raises(RuntimeError, match=r"bad.Bad.count is marked \(names_stream\)"):
        stream_path(pool.FindMessageTypeByName("bad.Bad"))


def test_the_stream_name_is_read_from_wire_bytes_without_parsing():
    big = pb.PublishRequest(stream="orders", arrow_stream=b"x" * (1 << 20)).SerializeToString()
    assert bytes(field_bytes(big, 1)) == b"orders"
    opening = pb.SubscribeRequest(credits=5)
    opening.open.stream = "payments"
    inner = field_bytes(opening.SerializeToString(), 1)
    assert inner is not None and bytes(field_bytes(inner, 1)) == b"payments"
    assert field_bytes(b"\x0a\x05ab", 1) is None  # truncated: the parser reports it later
    assert field_bytes(pb.FetchRequest(offset=3).SerializeToString(), 1) is None
    twice = (pb.FetchRequest(stream="a").SerializeToString()
             + pb.FetchRequest(stream="b").SerializeToString())
    assert bytes(field_bytes(twice, 1)) == b"b"  # protobuf's rule: the last one wins

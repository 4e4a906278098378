"""The stream mover (broker/cluster/move.py, move_in.py) in one process, without gRPC.

Two members, each with its own data dir, metadata database, registry, groups
and the context's state owners; the source's MoveIn calls go straight to the
target's receiver. What a user relies on: after the move the target serves
the stream with the same messages, offsets, schema, config, group positions
and sink floors, the source holds nothing of it, and a move stopped at any
step finishes when run again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace

import grpc
import pyarrow as pa
import pytest

from npstream.broker.auth.access import AccessControl
from npstream.broker.cluster.move import Mover
from npstream.broker.cluster.move_in import MoveReceiver
from npstream.broker.cluster.move_state import MoveBook
from npstream.broker.cluster.router import Cluster
from npstream.broker.errors import InvalidArgumentError, MemberUnavailableError
from npstream.broker.groups.service import group_manager
from npstream.broker.groups.store import GroupStore
from npstream.broker.handover import StateRecord
from npstream.broker.metadata import Metadata
from npstream.broker.server.config import default_config
from npstream.broker.server.context import BrokerContext, state_owners
from npstream.broker.server.metrics import BrokerMetrics
from npstream.broker.sink.markers import SinkMarkers
from npstream.broker.storage import Storage
from npstream.broker.storage.files import stream_dir
from npstream.broker.streams.registry import StreamRegistry
from npstream.proto import pb
from npstream.proto.schema import normalize_publish_table


class _Wire:
    """The members' MoveIn calls, in process; ``down`` members do not answer."""

    def __init__(self) -> None:
        self.receivers: dict[str, MoveReceiver] = {}
        self.down: set[str] = set()

    def call(self, member: str, method: str, request: bytes,
             metadata: Sequence[tuple[str, str]], timeout_s: float | None = None) -> bytes:
        if member in self.down:
            raise _Unavailable()
        reply = self.receivers[member].step(pb.MoveInRequest.FromString(request))
        return reply.SerializeToString()


class _Unavailable(grpc.RpcError):
    """What a gRPC call to a member that is down raises (code() is UNAVAILABLE)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"


class _Membership:
    """The two members as etcd would list them (no etcd here; the owner records are
    _Records, the real ones are tested in tests/e2e/test_stream_move.py)."""

    def __init__(self, identity: str) -> None:
        self.record = SimpleNamespace(id=identity)

    def addresses(self) -> tuple[str, ...]:
        return ("a:1", "b:1")

    known_addresses = addresses

    def id_of(self, address: str) -> str:
        return address


class _Records:
    """The owner records, in memory: what each switch wrote."""

    def __init__(self) -> None:
        self.leaders: dict[str, str] = {}

    def lookup(self, stream: str) -> None:
        return None

    def move_leader(self, stream: str, source: str, target: str) -> None:
        self.leaders[stream] = target


class _Member:
    def __init__(self, root: Path, identity: str, wire: _Wire) -> None:
        config = default_config().with_values(data_dir=root / identity)
        config.server.data_dir.mkdir(parents=True)
        self.metadata = Metadata(config.server.data_dir)
        self.storage = Storage(config.storage)
        listeners: list = []
        self.registry = StreamRegistry(self.metadata, self.storage, config.streams,
                                       config.server.max_message_bytes_limit,
                                       on_stream_deleted=listeners)
        self.ctx = BrokerContext(config=config, metadata=self.metadata, storage=self.storage,
                                 registry=self.registry, metrics=BrokerMetrics(),
                                 on_stream_deleted=listeners,
                                 state_owners=state_owners(self.metadata, self.registry))
        self.ctx.cluster = Cluster(identity, self.registry.__contains__, AccessControl(),
                                   wire, enabled=True)  # type: ignore[arg-type]
        self.ctx.cluster.membership = _Membership(identity)  # type: ignore[assignment]
        self.ctx.cluster.records = _Records()  # type: ignore[assignment]
        self.groups = group_manager(self.ctx)
        self.book = MoveBook(self.metadata)
        self.mover = Mover(self.ctx, self.book)
        wire.receivers[identity] = MoveReceiver(self.ctx, self.book)

    def close(self) -> None:
        self.groups.close()
        self.storage.close()
        self.metadata.close()


class _Context:
    """The MoveStream call's context: no metadata (auth off)."""

    def invocation_metadata(self) -> tuple[()]:
        return ()


@pytest.fixture
def members(tmp_path: Path) -> Iterator[tuple[_Member, _Member, _Wire]]:
    wire = _Wire()
    source, target = _Member(tmp_path, "a:1", wire), _Member(tmp_path, "b:1", wire)
    yield source, target, wire
    source.close()
    target.close()


def _publish(member: _Member, stream: str, values: list[bytes]) -> None:
    table = normalize_publish_table(pa.table({"value": pa.array(values, pa.binary())}))
    member.registry.get(stream).append(table)


def _values(member: _Member, stream: str) -> list[tuple[int, bytes]]:
    stream_log = member.registry.get(stream)
    table = stream_log.read_table(0, stream_log.end_offset)
    return list(zip(table.column("offset").to_pylist(), table.column("value").to_pylist(),
                    strict=True))


def _typed_values(member: _Member, stream: str) -> list[tuple[int, dict[str, object]]]:
    stream_log = member.registry.get(stream)
    return [(row["offset"], row["value"]) for row in
            stream_log.read_table(0, stream_log.end_offset).to_pylist()]


def _move(source: _Member, stream: str) -> pb.MoveStreamResponse:
    return source.mover.move(stream, "b:1", _Context())  # type: ignore[arg-type]


def test_move_carries_messages_config_groups_and_sink_floors(members) -> None:
    source, target, _ = members
    source.registry.create("orders", {"max_age_ms": 86_400_000})
    _publish(source, "orders", [b"m0", b"m1", b"m2", b"m3"])
    source.groups.commit("orders", "billing", 3, 3)  # not yet written: the pause flushes it
    pending = SinkMarkers(source.metadata).begin("etl", 4, ["st-1"], ["orders"])
    SinkMarkers(source.metadata).finish(pending)

    reply = _move(source, "orders")

    assert (reply.end_offset, reply.groups, reply.source, reply.target) == (4, 1, "a:1", "b:1")
    assert source.ctx.cluster.records.leaders == {"orders": "b:1"}  # the switch recorded it
    assert _values(target, "orders") == [(0, b"m0"), (1, b"m1"), (2, b"m2"), (3, b"m3")]
    assert target.registry.describe("orders").config.max_age_ms == 86_400_000
    billing = GroupStore(target.metadata).get("orders", "billing")
    assert billing is not None and (billing.kind, billing.committed_offset) == ("cursor", 3)
    assert SinkMarkers(target.metadata).floor("etl", "orders") == 4
    assert "orders" not in source.registry
    assert not stream_dir(source.ctx.config.server.data_dir, "orders").exists()
    assert GroupStore(source.metadata).list("orders") == []
    assert source.book.moved_away("orders") == "b:1"


def test_move_of_typed_stream_keeps_its_schema_versions(members) -> None:
    source, target, _ = members
    source.registry.create("sensors", {}, value_schema="id BIGINT NOT NULL")
    source.registry.update("sensors", {}, value_schema="id BIGINT NOT NULL, unit STRING")

    _move(source, "sensors")

    assert [(v.version, v.ddl) for v in target.registry.schema_versions("sensors")] == [
        (1, "id BIGINT NOT NULL"), (2, "id BIGINT NOT NULL, unit STRING")]


def test_move_with_target_down_finishes_when_run_again(members) -> None:
    source, target, wire = members
    source.registry.create("chat", {})
    _publish(source, "chat", [b"hello", b"again"])
    wire.down.add("b:1")

    with pytest.raises(MemberUnavailableError, match="the move of stream 'chat' waits"):
        _move(source, "chat")
    assert source.book.active("chat").state == "copying"  # paused here, still its owner

    wire.down.clear()
    _move(source, "chat")

    assert _values(target, "chat") == [(0, b"hello"), (1, b"again")]
    assert source.book.active("chat") is None and "chat" not in source.registry


def test_move_install_refuses_unknown_state_kind_and_installs_nothing(members) -> None:
    source, target, _ = members
    source.registry.create("orders", {})
    _publish(source, "orders", [b"m0"])

    class _NewerOwner:  # a package the target does not have
        kinds = ("replica.lease",)

        def export(self, stream: str, /) -> list[StateRecord]:
            return [StateRecord("replica.lease", 1, {"epoch": 3})]

        def install(self, stream, records, txn, /) -> None:
            raise AssertionError("not on the target")

        def drop(self, stream, txn, /) -> None:
            pass

    source.ctx.state_owners.append(_NewerOwner())

    with pytest.raises(InvalidArgumentError, match=r"replica\.lease are unknown to this broker"):
        _move(source, "orders")

    assert "orders" not in target.registry
    assert target.metadata.execute_tuples("SELECT name FROM streams") == []
    assert source.book.active("orders").state == "switching"  # forward only, retried


def test_receiver_refuses_malformed_records_naming_them(members) -> None:
    _, target, _ = members
    request = pb.MoveInRequest(step=pb.MOVE_STEP_INSTALL, stream="orders",
                               move_id="0" * 32, source="a:1",
                               state_json=b'{"files": {}, "end_offset": 0, "records": [{}]}')

    with pytest.raises(InvalidArgumentError, match="stream state record without a kind"):
        MoveReceiver(target.ctx, target.book).step(request)

"""Stream owner records in a real etcd: created once, moved only from the recorded owner,
deleted only by it."""

from __future__ import annotations

import uuid

import pytest

from npstream.broker.cluster.errors import EtcdError
from npstream.broker.cluster.etcd.client import EtcdClient
from npstream.broker.cluster.stream_records import OwnerRecord, StreamRecords


@pytest.fixture
def records(etcd):
    client = EtcdClient(etcd.endpoint)
    yield StreamRecords(client, f"t{uuid.uuid4().hex[:12]}")
    client.close()


def test_create_records_a_new_stream_once_and_reports_another_members_record(records):
    assert records.create(["s1", "s2"], "m1") == []
    assert records.create(["s2", "s3"], "m2") == ["s2"]  # s2 stays m1's
    assert records.read("s2")[0] == OwnerRecord(("m1",), "m1", 1, ("m1",))
    assert records.read("s3")[0] == OwnerRecord(("m2",), "m2", 1, ("m2",))
    assert records.names() == {"s1", "s2", "s3"}


def test_move_leader_switches_only_from_the_recorded_owner(records):
    records.create(["s"], "m1")
    _record, kv = records.read("s")
    assert records.move_leader("s", "m1", "m2") == OwnerRecord(("m2",), "m2", 1, ("m2",))
    assert records.read("s")[1].mod_revision > kv.mod_revision
    assert records.move_leader("s", "m1", "m2").leader == "m2"  # a resumed move: done
    with pytest.raises(EtcdError, match="recorded in etcd on member m2, not on m1: not moved"):
        records.move_leader("s", "m1", "m3")
    assert records.read("s")[0].leader == "m2"


def test_delete_if_leader_removes_only_the_owners_record(records):
    records.create(["s"], "m1")
    assert not records.delete_if_leader("s", "m2")
    assert records.read("s")[0] is not None
    assert records.delete_if_leader("s", "m1")
    assert records.read("s") == (None, None)
    assert records.lookup("s") is None

"""Membership in etcd: real broker processes registering in a real etcd (session fixture)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from harness import BrokerProcess
from npstream.broker.cluster.etcd.client import EtcdClient
from npstream.cli.local_etcd import LocalEtcd, free_port


@pytest.fixture
def cluster_name() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def etcd_client(etcd):
    client = EtcdClient(etcd.endpoint)
    yield client
    client.close()


def _member_args(etcd_endpoint: str, cluster_name: str) -> list[str]:
    return ["--etcd", etcd_endpoint, "--cluster-name", cluster_name]


def _members(client: EtcdClient, cluster_name: str) -> list[dict]:
    items, _ = client.get_prefix(f"/npstream/{cluster_name}/members/")
    return [json.loads(kv.value) | {"_lease": kv.lease, "_key": kv.key} for kv in items]


def _wait_for(check, timeout: float = 15.0) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, "condition not met in time"
        time.sleep(0.05)
    return time.monotonic() - started


def _member(tmp_path, etcd, cluster_name, name="b0", **env) -> BrokerProcess:
    return BrokerProcess(tmp_path / name, args=_member_args(etcd.endpoint, cluster_name),
                         env={"NPSTREAM_MEMBER_LEASE": "2s", **env}).start()


def test_broker_with_etcd_registers_under_a_lease_and_leaves_on_clean_stop(
        tmp_path, etcd, etcd_client, cluster_name):
    broker = _member(tmp_path, etcd, cluster_name, NPSTREAM_RACK="r1")
    try:
        members = _members(etcd_client, cluster_name)
        member_id = (tmp_path / "b0" / "member-id").read_text().strip()
        disk_id = (tmp_path / "b0" / "disk-id").read_text().strip()
        assert len(members) == 1
        record = members[0]
        assert record["_key"] == f"/npstream/{cluster_name}/members/{member_id}"
        assert (record["id"], record["address"], record["rack"], record["disk_id"]) == (
            member_id, broker.address, "r1", disk_id)
        assert record["_lease"] != 0
        assert abs(record["started_at"] - time.time()) < 60
    finally:
        assert broker.stop() == 0
    # Revoked at the stop, not left to expire.
    assert _members(etcd_client, cluster_name) == []
    assert etcd_client.time_to_live(record["_lease"]) == -1


def test_member_id_is_stable_across_restarts_of_one_data_dir(
        tmp_path, etcd, etcd_client, cluster_name):
    broker = _member(tmp_path, etcd, cluster_name)
    first = _members(etcd_client, cluster_name)[0]
    broker.restart(hard=True)  # kill -9: the old lease still lives, the record is ours
    try:
        second = _members(etcd_client, cluster_name)
        assert [m["id"] for m in second] == [first["id"]]
        assert second[0]["_lease"] != first["_lease"]
        assert etcd_client.time_to_live(first["_lease"]) == -1
    finally:
        broker.stop()


def test_killed_member_leaves_the_list_when_its_lease_runs_out(
        tmp_path, etcd, etcd_client, cluster_name):
    broker = _member(tmp_path, etcd, cluster_name)
    broker.kill()
    assert len(_members(etcd_client, cluster_name)) == 1
    took = _wait_for(lambda: not _members(etcd_client, cluster_name), timeout=10)
    assert took < 5  # a 2 s lease (etcd may round it up a little)


def test_cluster_status_lists_every_member_registered_in_etcd(
        tmp_path, etcd, etcd_client, cluster_name):
    brokers = [_member(tmp_path, etcd, cluster_name, name=f"b{i}") for i in range(2)]
    try:
        result = subprocess.run(
            [sys.executable, "-m", "npstream.cli", "cluster", "status", "--json",
             "--broker", brokers[0].address], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        status = json.loads(result.stdout)
        assert status["broker"] == brokers[0].address
        assert sorted(m["address"] for m in status["members"]) == sorted(
            b.address for b in brokers)
        assert all(m["up"] for m in status["members"])
        # A member that stops cleanly leaves the live members at once, and stays known
        # (nodes/): the status shows it down, so nothing of it is silently left out.
        brokers[1].stop()
        assert [m["address"] for m in _members(etcd_client, cluster_name)] == [
            brokers[0].address]
        result = subprocess.run(
            [sys.executable, "-m", "npstream.cli", "cluster", "status", "--json",
             "--broker", brokers[0].address], capture_output=True, text=True, timeout=60)
        assert result.returncode == 1
        assert {m["address"]: m["up"] for m in json.loads(result.stdout)["members"]} == {
            brokers[0].address: True, brokers[1].address: False}
    finally:
        for broker in brokers:
            broker.stop()


def test_second_live_broker_on_a_copied_data_dir_is_refused(
        tmp_path, etcd, cluster_name):
    broker = _member(tmp_path, etcd, cluster_name)
    try:
        (tmp_path / "copy").mkdir()
        for name in ("member-id", "disk-id"):
            (tmp_path / "copy" / name).write_text((tmp_path / "b0" / name).read_text())
        with pytest.raises(RuntimeError, match=r"member id \w+ is registered in etcd by "
                                               r"127\.0\.0\.1:\d+ under a live lease"):
            _member(tmp_path, etcd, cluster_name, name="copy")
    finally:
        broker.stop()


def test_broker_with_etcd_out_of_reach_at_start_fails_naming_it(tmp_path, cluster_name):
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError, match=f"cannot join cluster '{cluster_name}' in etcd: "
                                           f"no etcd endpoint of {dead} answered"):
        BrokerProcess(tmp_path / "b0", args=["--etcd", dead, "--cluster-name", cluster_name],
                      env={"NPSTREAM_PEER_TIMEOUT": "1s"}).start()


def test_broker_keeps_serving_when_etcd_is_lost_and_registers_again_when_back(
        tmp_path, cluster_name):
    from npstream import BrokerUnavailable, Client

    etcd = LocalEtcd(tmp_path / "etcd").start()
    broker = None
    try:
        broker = _member(tmp_path, etcd, cluster_name)
        with Client(broker.address) as client:
            client.create_stream("kept")
        port = etcd.client_port
        etcd.stop()
        time.sleep(3.5)  # past the 2 s lease
        with Client(broker.address, retry_deadline=1) as client:
            assert client.publish("kept", b"a").offset == 0
            assert client.fetch("kept", 0).column("value").to_pylist() == [b"a"]
            # A new name: who holds it is unknown without etcd, so it is not created.
            with pytest.raises(BrokerUnavailable, match="it is unknown who holds stream"):
                client.create_stream("new")
        assert "lost its etcd registration" in broker.log_text()
        etcd = LocalEtcd(tmp_path / "etcd", client_port=port).start()
        check = EtcdClient(etcd.endpoint)
        try:
            _wait_for(lambda: [m["address"] for m in _members(check, cluster_name)] == [
                broker.address], timeout=15)
        finally:
            check.close()
    finally:
        if broker is not None:
            broker.stop()
        etcd.stop()


@pytest.mark.parametrize(("env", "message"), [
    ({"NPSTREAM_ETCD": "localhost:2379"},
     "etcd endpoint 'localhost:2379' is not http://HOST:PORT or https://HOST:PORT"),
    ({"NPSTREAM_ETCD": "http://127.0.0.1:2379", "NPSTREAM_MEMBERS": "127.0.0.1:7070"},
     "[cluster] members (--cluster-members, NPSTREAM_MEMBERS) is gone"),
    ({"NPSTREAM_ETCD": "http://127.0.0.1:2379", "NPSTREAM_CLUSTER_NAME": "a/b"},
     "cluster_name='a/b' must be 1 to 63 letters"),
    ({"NPSTREAM_ETCD": "http://127.0.0.1:2379", "NPSTREAM_MEMBER_LEASE": "1500ms"},
     "member_lease=1500ms must be whole seconds, at least 2s"),
])
def test_broker_with_bad_cluster_settings_refuses_to_start_naming_them(tmp_path, env,
                                                                       message):
    with pytest.raises(RuntimeError, match="exited with 2") as info:
        BrokerProcess(tmp_path / "b0", env=env).start()
    assert message in str(info.value)

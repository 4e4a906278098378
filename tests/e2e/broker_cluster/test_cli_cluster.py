"""``npstream cluster status`` and ``npstream cluster local`` against real brokers on loopback.

status: every member listed with its own streams, a killed member shown down
(exit 1) while the others still count, a broker without a cluster is a
cluster of one. local: N brokers on consecutive ports form one cluster that
reaches streams on every member, and SIGTERM to the command stops them all.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from cluster_members import free_ports, names_on
from harness import BrokerProcess
from npstream import Client

pytestmark = pytest.mark.slow


def npstream(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NPSTREAM_BROKER", "NPSTREAM_TOKEN")}
    return subprocess.run([sys.executable, "-m", "npstream.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def status(broker: str) -> tuple[int, dict[str, dict]]:
    """(exit code, each member's JSON status by address)."""
    done = npstream("cluster", "status", "--json", "--broker", broker)
    assert done.stdout, done.stderr
    return done.returncode, {m["address"]: m for m in json.loads(done.stdout)["members"]}


def consecutive_free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports free now."""
    for _ in range(200):
        first = free_ports(1)[0]
        if first + count > 65535:
            continue
        sockets = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no consecutive free ports")


CLUSTER_SIZE = 3  # the module's cluster_members (tests/e2e/broker_cluster/conftest.py)


@pytest.fixture(scope="module")
def members(cluster_members: list[BrokerProcess]) -> list[BrokerProcess]:
    return cluster_members


def test_status_lists_members_with_their_streams_and_a_killed_one_as_down(members):
    a, b, c = members
    addresses = [m.address for m in members]
    prefix = f"st-{uuid.uuid4().hex[:6]}"
    placed = {a.address: names_on(a.address, addresses, prefix, 3),
              b.address: names_on(b.address, addresses, prefix, 1)}
    with Client(c.address) as client:  # through a member that holds none of them
        for names in placed.values():
            for name in names:
                client.publish(name, {"n": 1})
                client.publish(name, {"n": 2})

    code, seen = status(b.address)
    assert code == 0
    assert sorted(seen) == sorted(addresses)
    assert [seen[m]["up"] for m in addresses] == [True, True, True]
    assert [seen[m]["streams"] for m in addresses] == [3, 1, 0]
    assert [seen[m]["messages"] for m in addresses] == [6, 2, 0]
    assert seen[a.address]["bytes"] > seen[b.address]["bytes"] > 0
    assert [seen[m]["asked"] for m in addresses] == [False, True, False]

    text = npstream("cluster", "status", "--broker", a.address)
    assert text.returncode == 0, text.stderr
    assert "3 member(s), 3 up" in text.stdout
    assert f"{a.address} *" in text.stdout

    b.kill()
    try:
        code, seen = status(a.address)
        assert code == 1
        assert [seen[m]["up"] for m in addresses] == [True, False, True]
        assert seen[b.address]["streams"] is None and seen[b.address]["error"]
        assert [seen[m]["streams"] for m in (a.address, c.address)] == [3, 0]
        text = npstream("cluster", "status", "--broker", c.address)
        assert text.returncode == 1
        assert "3 member(s), 2 up" in text.stdout and b.address in text.stderr
    finally:
        b.start()


def test_status_of_a_broker_without_a_cluster_is_one_member(tmp_path):
    broker = BrokerProcess(tmp_path / "single").start()
    try:
        with Client(broker.address) as client:
            client.publish("alone", {"n": 1})
        code, seen = status(broker.address)
        assert code == 0
        assert list(seen) == [broker.address]
        assert seen[broker.address]["up"] and seen[broker.address]["streams"] == 1
    finally:
        broker.stop()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_cluster_local_runs_n_brokers_as_one_cluster_and_sigterm_stops_them(tmp_path: Path):
    first = consecutive_free_ports(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "npstream.cli", "cluster", "local", "--brokers", "2",
         "--data-dir", str(tmp_path / "d"), "--port", str(first)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert "cluster of 2 broker(s) serving" in lines[2], (lines, proc.stderr)
        addresses = [line.split()[0] for line in lines[:2]]
        assert addresses == [f"127.0.0.1:{first}", f"127.0.0.1:{first + 1}"]
        pids = [int(line.split("pid=")[1].split()[0]) for line in lines[:2]]
        etcd_pid = int(lines[2].split("pid=")[1].split()[0])  # the cluster's own etcd
        assert (tmp_path / "d" / "etcd").is_dir()
        assert all((tmp_path / "d" / f"broker-{i}").is_dir() for i in range(2))

        prefix = f"loc-{uuid.uuid4().hex[:6]}"
        names = [*names_on(addresses[0], addresses, prefix, 2),
                 *names_on(addresses[1], addresses, prefix, 1)]
        with Client(addresses[0]) as client:
            for name in names:
                client.publish(name, {"name": name})
            assert {s.name for s in client.list_streams()} >= set(names)
        code, seen = status(addresses[1])
        assert code == 0
        assert [(seen[a]["up"], seen[a]["streams"]) for a in addresses] == [(True, 2), (True, 1)]

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        deadline = time.monotonic() + 10
        while not all(_gone(pid) for pid in [*pids, etcd_pid]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_gone(pid) for pid in [*pids, etcd_pid])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

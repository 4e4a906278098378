"""``[server] cpu_affinity``: parsing, the CPU chosen, and a real broker process pinned."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import BrokerProcess
from npstream.broker.server.affinity import _choose, _parse_cpu_list, parse_cpu_affinity
from npstream.broker.server.config import ConfigError, load_config

LINUX_AFFINITY = hasattr(os, "sched_getaffinity")
MULTI_CPU = LINUX_AFFINITY and len(os.sched_getaffinity(0)) >= 2


def thread_cpus(pid: int) -> dict[int, frozenset[int]]:
    """The CPUs each thread of ``pid`` may run on (its Cpus_allowed_list), by thread id."""
    out: dict[int, frozenset[int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
        out[int(tid)] = frozenset(_parse_cpu_list(line.split(":", 1)[1].strip()))
    return out


def test_default_is_auto_and_env_overrides():
    assert load_config(None, env={}).server.cpu_affinity == "auto"
    assert load_config(None, env={"NPSTREAM_CPU_AFFINITY": "none"}).server.cpu_affinity == "none"
    listed = load_config(None, env={"NPSTREAM_CPU_AFFINITY": " 3,0-1 "})
    assert listed.server.cpu_affinity == "0,1,3"


@pytest.mark.parametrize("raw", ["x", "1-", "-1", "3-1", "1,,2", "0.5"])
def test_bad_values_are_refused_naming_the_key(raw):
    with pytest.raises(ConfigError, match=r"bad value for 'cpu_affinity'.*cpu_affinity"):
        load_config(None, env={"NPSTREAM_CPU_AFFINITY": raw})


def test_parse_normalises_lists_and_words():
    assert parse_cpu_affinity("AUTO") == "auto"
    assert parse_cpu_affinity("off") == "none"
    assert parse_cpu_affinity("") == "none"
    assert parse_cpu_affinity("4-6,1") == "1,4,5,6"


def test_auto_picks_one_allowed_cpu_by_pid():
    assert _choose("auto", {0, 1}, 7) == {1}
    assert _choose("auto", {0, 1}, 8) == {0}
    assert _choose("auto", {2, 5, 9}, 4) == {5}
    assert _choose("auto", {3}, 4) is None  # one CPU: nothing to pin
    assert _choose("none", {0, 1}, 4) is None
    assert _choose("0,1", {0, 1, 2}, 4) == {0, 1}


def test_explicit_list_outside_the_allowed_set_is_refused():
    with pytest.raises(ValueError, match=r"names CPUs this process may not use \(allowed: 0,1\)"):
        _choose("1-2", {0, 1}, 4)


@pytest.mark.skipif(not MULTI_CPU, reason="needs Linux with at least 2 usable CPUs")
def test_broker_process_auto_pins_every_thread_to_one_cpu(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        from npstream import Client

        with Client(broker.address) as client:  # gRPC threads are running by now
            client.publish("pinned", b"x")
        cpus = thread_cpus(broker.pid)
        assert len(cpus) > 3
        allowed = sorted(os.sched_getaffinity(0))
        assert set(cpus.values()) == {frozenset({allowed[broker.pid % len(allowed)]})}
        assert "broker pinned to CPU" in broker.log_text()
    finally:
        broker.stop()


@pytest.mark.skipif(not MULTI_CPU, reason="needs Linux with at least 2 usable CPUs")
def test_broker_process_none_leaves_placement_to_the_os(tmp_path):
    broker = BrokerProcess(tmp_path / "data", env={"NPSTREAM_CPU_AFFINITY": "none"}).start()
    try:
        assert set(thread_cpus(broker.pid).values()) == {frozenset(os.sched_getaffinity(0))}
        assert "pinned" not in broker.log_text()
    finally:
        broker.stop()


@pytest.mark.skipif(not LINUX_AFFINITY, reason="CPU affinity is Linux-only")
def test_broker_refuses_a_cpu_it_may_not_use(tmp_path):
    far = max(os.sched_getaffinity(0)) + 1
    proc = subprocess.run(
        [sys.executable, "-m", "npstream.broker", "--data-dir", str(tmp_path / "d"),
         "--port", "0"],
        env={**os.environ, "NPSTREAM_CPU_AFFINITY": str(far), "NPSTREAM_METRICS_PORT": "off"},
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"cpu_affinity '{far}' names CPUs this process may not use" in proc.stderr

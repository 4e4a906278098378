"""``make demo BROKERS=2``: the sensor demo on a cluster of two brokers, its streams on both.

run_demo.py starts two brokers (consecutive ports, one cluster), names its
readings and windows streams so that they live on different members, and
runs the producer and the Spark pipeline through the first member: the
readings go to their member by redirects, Spark reads them across members
and writes its windows exactly once to the other. Checked from the demo's
own summary: both members used, every window in the results stream also in
the JSON-lines sink, and after the run each stream in its member's data dir.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from quick_jvm import quick_jvm_env

from harness import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def two_free_ports() -> int:
    """A port P with P and P+1 free now (the demo's members take consecutive ports)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port >= 65535:
            continue
        with socket.socket() as first, socket.socket() as second:
            try:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports")


def test_the_demo_runs_on_two_brokers_with_its_streams_on_both(tmp_path: Path) -> None:
    port = two_free_ports()
    env = {**quick_jvm_env(), "PYSPARK_PYTHON": sys.executable}
    env.pop("NPSTREAM_BROKER", None)
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "sensor_pipeline" / "run_demo.py"),
         "--brokers", "2", "--broker", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "data"),
         "--seconds", "16", "--rate", "30", "--metrics-port", "0"],
        capture_output=True, text=True, env=env, timeout=420, cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, f"{out[-3000:]}\n{proc.stderr[-5000:]}"
    placed = re.search(r"cluster of 2 brokers: '(\S+)' on (\S+), '(\S+)' on (\S+)", out)
    assert placed, out[-3000:]
    source, source_member, results, results_member = placed.groups()
    assert {source_member, results_member} == {f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"}
    published = int(re.search(r"readings published to '\S+':\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    windows = int(re.search(r"tumbling windows in stream '\S+': (\d+)", out).group(1))  # type: ignore[union-attr]
    lines = int(re.search(r"tumbling windows in JSON lines:\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    assert published > 200
    assert windows == lines > 0  # exactly once into the stream on the other member
    member_dir = {f"127.0.0.1:{port + i}": tmp_path / "data" / f"broker-{i}" for i in (0, 1)}
    assert (member_dir[source_member] / "streams" / source).is_dir()
    assert (member_dir[results_member] / "streams" / results).is_dir()
    assert not (member_dir[source_member] / "streams" / results).exists()

"""Spark starts beside a busy npstream client, every time (issue 18, grpc/grpc#43055).

A notebook user publishes with a ``Client`` in a thread and then calls
``SparkSession.builder.getOrCreate()``. PySpark starts the JVM with
``Popen(preexec_fn=...)``; with gRPC's fork handlers on (grpcio >= 1.80's
default) that child crashed while the channel was busy, in 2 of 10 starts
here before the fix (docs/spark.md, "gRPC and fork"). The package now turns
the handlers off before grpc is imported (connector/fork_safety.py); this
starts Spark ``NPSTREAM_SPARK_STARTS`` times (default 4; 20 for the long run), each in a fresh
interpreter that inherits no ``GRPC_ENABLE_FORK_SUPPORT`` (the pytest process
has the package's default in its environment), and requires every start to
succeed while the publisher kept publishing through it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness import SUPPORT_DIR

SCRIPT = SUPPORT_DIR / "spark_beside_client.py"
# The suite starts Spark 4 times (~40 s); the 20 (NPSTREAM_SPARK_STARTS=20) passed
# 20 of 20 in 466 s on the loaded 2-core machine (see the issue 18 note).
STARTS = int(os.environ.get("NPSTREAM_SPARK_STARTS", "4"))

# A start takes 6-15 s on the 2-core test machine (more under load).
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(120 + 60 * STARTS)]


def test_spark_starts_every_time_beside_a_publishing_client(broker, client, stream_name):
    client.create_stream(stream_name)
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    failures: list[str] = []
    published = 0
    for start in range(STARTS):
        run = subprocess.run([sys.executable, str(SCRIPT), broker.address, stream_name],
                             capture_output=True, text=True, env=env, timeout=300)
        lines = run.stdout.strip().splitlines()
        if run.returncode != 0 or not lines:
            failures.append(f"start {start}: exit {run.returncode}: {run.stderr[-2000:]}")
            continue
        result = json.loads(lines[-1])
        assert result["sum"] == 4950 and result["errors"] == []
        assert result["during_start"] > 0  # the channel was busy while the JVM started
        published += result["total"]
    assert failures == []
    assert client.stream_info(stream_name).message_count == published

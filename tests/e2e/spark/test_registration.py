"""How Spark finds the "npstream" format: register(spark), and discovery from a real install.

The discovery test builds a wheel, installs it into a temporary directory and
runs a fresh Spark (driver and Python workers) on an interpreter that cannot
see the editable install, so only Spark's own ``pyspark_*`` module discovery
can make ``format("npstream")`` work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from quick_jvm import quick_jvm_env

from harness import REPO_ROOT, build_wheel
from npstream.spark import FORMAT, NpstreamDataSource, register
from npstream.spark.batch_reader import pushdown_requested

pytestmark = pytest.mark.spark

REPO = REPO_ROOT


def test_register_twice_then_read_batch(spark, broker, client, stream_name):
    client.publish_batch(stream_name, [{"value": b"a"}, {"value": b"b"}])
    register(spark)
    register(spark)  # idempotent
    rows = (spark.read.format(FORMAT).option("broker", broker.address)
            .option("stream", stream_name).load().select("offset", "value").collect())
    assert sorted((r.offset, r.value) for r in rows) == [(0, b"a"), (1, b"b")]
    assert spark.conf.get("spark.sql.python.filterPushdown.enabled") == "true"


def test_data_source_name_and_discovery_class():
    import pyspark_npstream

    assert NpstreamDataSource.name() == "npstream"
    assert issubclass(pyspark_npstream.DefaultSource, NpstreamDataSource)
    assert pyspark_npstream.DefaultSource.name() == "npstream"
    assert pushdown_requested() is False  # only inside Spark's pushdown worker


DISCOVERY_JOB = textwrap.dedent("""
    import json, sys
    import npstream, pyspark_npstream
    from pyspark.sql import SparkSession

    broker, stream, out = sys.argv[1:4]
    spark = (SparkSession.builder.master("local[1]").appName("discovery")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    frame = (spark.readStream.format("npstream").option("broker", broker)
             .option("stream", stream).option("startingOffsets", "earliest").load())
    query = (frame.selectExpr("offset", "CAST(value AS STRING) AS value")
             .writeStream.format("memory").queryName("discovered")
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    streamed = [[r.offset, r.value] for r in
                spark.table("discovered").orderBy("offset").collect()]
    batch = spark.read.format("npstream").option("broker", broker).option(
        "stream", stream).load().count()
    with open(out, "w") as handle:
        json.dump({"streamed": streamed, "batch": batch,
                   "exception": str(query.exception()) if query.exception() else None,
                   "npstream": npstream.__file__,
                   "pyspark_npstream": pyspark_npstream.__file__}, handle)
    spark.stop()
""")


@pytest.mark.slow
def test_discovery_from_wheel_install_reads_without_register(broker, client, stream_name,
                                                              tmp_path):
    client.publish_batch(stream_name, [{"value": f"m{i}"} for i in range(4)])
    wheel, _ = build_wheel(tmp_path)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet",
                    "--target", str(target), str(wheel)], check=True, timeout=300)
    site_packages = next(p for p in sys.path if p.endswith("site-packages")
                         and Path(p, "pyspark").is_dir())
    # `python -S` skips .pth files, so the editable install's import hook is
    # never installed; the dependencies come from site-packages via PYTHONPATH.
    python = tmp_path / "python-no-site"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    job = tmp_path / "job.py"
    job.write_text(DISCOVERY_JOB)
    out = tmp_path / "out.json"
    env = {
        **quick_jvm_env(),
        "PYTHONPATH": f"{target}{os.pathsep}{site_packages}",
        "PYSPARK_PYTHON": str(python),
        "PYSPARK_DRIVER_PYTHON": str(python),
    }
    env.pop("SPARK_CONF_DIR", None)

    result = subprocess.run([str(python), str(job), broker.address, stream_name, str(out)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)

    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["exception"] is None
    assert report["pyspark_npstream"].startswith(str(target))
    assert report["npstream"].startswith(str(target))
    assert report["streamed"] == [[i, f"m{i}"] for i in range(4)]
    assert report["batch"] == 4


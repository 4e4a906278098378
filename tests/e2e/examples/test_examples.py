"""Every example runs with spark-submit against a real local broker and prints what it promises."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from quick_jvm import quick_jvm_env

from harness import REPO_ROOT, BrokerProcess

ROOT = REPO_ROOT
SPARK_SUBMIT = Path(sys.executable).parent / "spark-submit"

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def spark_submit(script: str, broker: BrokerProcess, *args: str) -> str:
    env = {**quick_jvm_env(), "PYSPARK_PYTHON": sys.executable,
           "NPSTREAM_BROKER": broker.address}
    proc = subprocess.run(
        [str(SPARK_SUBMIT), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
         "--conf", "spark.sql.shuffle.partitions=2", str(ROOT / "examples" / script), *args],
        capture_output=True, text=True, env=env, timeout=240,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def test_event_sourcing_replay_gives_balance_75(broker: BrokerProcess, client) -> None:
    out = spark_submit("event_sourcing/event_sourcing.py", broker, "--broker", broker.address,
                       "--stream", "accounts-test")
    assert "acc-1 balance 75.00" in out.splitlines()
    # the events carry ids: publishing the same history again stores nothing new
    assert client.stream_info("accounts-test").message_count == 2


def test_analytics_two_groups_each_group_sees_its_share(broker: BrokerProcess) -> None:
    out = spark_submit("analytics_two_groups/analytics_two_groups.py", broker,
                       "--broker", broker.address, "--before", "100", "--after", "50")
    lines = out.splitlines()
    assert "dashboard (from latest) counted 50 page views" in lines
    assert "warehouse loader (from earliest) loaded 150 events" in lines
    assert "group dashboard: committed offset 150, lag 0" in lines
    assert "group warehouse-loader: committed offset 150, lag 0" in lines


def test_audit_replay_reports_only_the_second_round(broker: BrokerProcess) -> None:
    out = spark_submit("audit_replay/audit_replay.py", broker, "--broker", broker.address)
    lines = out.splitlines()
    assert "delete: 3" in lines
    assert "login: 1" in lines
    assert not any(line.startswith(("read:", "logout:")) for line in lines)


def test_notebook_runs_headless(broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("NPSTREAM_BROKER", broker.address)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", quick_jvm_env()["SPARK_SUBMIT_OPTS"])
    nb = nbformat.read(ROOT / "examples" / "notebook.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    published = nb.cells[3].outputs[0]["data"]["text/plain"]
    assert published == "(0, 12)"
    schema = nb.cells[5].outputs[-1]["text"]  # typed columns, no from_json
    assert " |-- sensorId: string" in schema and " |-- ts: timestamp" in schema
    created = [o for o in nb.cells[7].outputs if o.get("output_type") == "execute_result"]
    assert created[0]["data"]["text/plain"] == (
        "'start TIMESTAMP, sensorId STRING, count BIGINT, avg DOUBLE, max DOUBLE'")
    table = nb.cells[9].outputs[-1]["data"]["text/plain"].splitlines()
    assert [line.split()[3:] for line in table[1:]] == [
        ["sensor-1", "3", "20.0", "40.0"], ["sensor-2", "2", "20.0", "30.0"],
        ["sensor-1", "2", "70.0", "80.0"], ["sensor-2", "3", "70.0", "90.0"],
        ["sensor-1", "1", "100.0", "100.0"], ["sensor-2", "1", "110.0", "110.0"]]
    chart = nb.cells[11].outputs  # the windows drawn with matplotlib
    assert [o for o in chart if "image/png" in o.get("data", {})], chart
    drawn = [o for o in chart if o.get("output_type") == "execute_result"]
    assert ast.literal_eval(drawn[0]["data"]["text/plain"]) == [
        ("sensor-1 avg", [20.0, 70.0, 100.0]), ("sensor-1 max", [40.0, 80.0, 100.0]),
        ("sensor-2 avg", [20.0, 70.0, 110.0]), ("sensor-2 max", [30.0, 90.0, 110.0])]

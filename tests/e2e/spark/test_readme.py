"""The README's Python snippets, run as written against a real broker and the local Spark.

Only two things are replaced: the broker address (the test's broker listens
on an ephemeral port, not localhost:7070) and the checkpoint directory (a
fresh one per run).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from npstream import Client

pytestmark = pytest.mark.spark

README = Path(__file__).resolve().parents[3] / "README.md"
SNIPPET = re.compile(r"```python\n(.*?)```", re.DOTALL)
README_BROKER = "localhost:7070"
README_CHECKPOINT = "/tmp/npstream-averages"


def test_readme_snippets_run_and_read_what_they_published(spark, broker, tmp_path):
    from npstream.spark import register

    # This checkout is installed editable, which Spark's own discovery does not see
    # (docs/spark.md); an installed package needs no call.
    register(spark)
    snippets = SNIPPET.findall(README.read_text())
    assert len(snippets) == 3, "the README's Python snippets changed: update this test"
    namespace: dict[str, Any] = {}
    try:
        for snippet in snippets:
            assert README_BROKER in snippet
            code = snippet.replace(README_BROKER, broker.address).replace(
                README_CHECKPOINT, str(tmp_path / "averages"))
            exec(compile(code, str(README), "exec"), namespace)

        assert namespace["table"].column("id").to_pylist() == ["evt-1"]
        rows = spark.table("events_so_far").collect()
        assert [(row.offset, row.value) for row in rows] == [(0, '{"sensor":"s1","temp":21.5}')]
        with Client(broker.address) as client:
            averages = client.fetch("averages", offset=0).column("value").to_pylist()
        assert [(a["sensorId"], a["avg"]) for a in averages] == [("s1", 21.5)]
    finally:
        for query in spark.streams.active:
            query.stop()

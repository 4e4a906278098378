"""gRPC's fork handlers are off before grpc is first imported, on every way into the package.

They crash a child forked by ``Popen(preexec_fn=...)`` while a channel is
busy (grpc/grpc#43055), which is how PySpark starts its JVM
(connector/fork_safety.py). gRPC reads the variable when ``grpc`` is first
imported, so what counts is its value at that moment: a probe on
``sys.meta_path`` records it, in a fresh interpreter per entry point.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROBE = """
import os, sys
seen = []
class Probe:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" and not seen:
            seen.append(os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "<unset>"))
        return None
sys.meta_path.insert(0, Probe())
import importlib
importlib.import_module(sys.argv[1])
print(seen[0] if seen else "<grpc not imported>", os.environ.get("GRPC_ENABLE_FORK_SUPPORT"))
"""

# Every way in: the SDK, its connection module directly, the CLI's entry point,
# Spark's discovery module and the data source it names, the contract, the broker.
ENTRY_MODULES = ["npstream", "npstream.client.connection", "npstream.cli.main",
                 "pyspark_npstream", "npstream.spark.source", "npstream.proto",
                 "npstream.broker.server.process"]


def _probe(module: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    result = subprocess.run([sys.executable, "-c", _PROBE, module], capture_output=True,
                            text=True, check=True, timeout=120, env={**clean, **env})
    return result.stdout.strip()


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_fork_handlers_are_off_when_grpc_is_first_imported(module):
    # at grpc's import, and afterwards for child processes (Spark's JVM and workers)
    assert _probe(module) == "false false"


@pytest.mark.parametrize("value", ["true", "1", "false"])
def test_a_value_the_user_set_wins(value):
    assert _probe("npstream", GRPC_ENABLE_FORK_SUPPORT=value) == f"{value} {value}"

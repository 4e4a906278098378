"""JVM options for the Spark JVMs the tests start in processes of their own.

Those JVMs (a spark-submit, a script's own SparkSession, the standalone
cluster's daemons) live for seconds to a minute on 2 shared cores: the quick
JIT (C1 only) and one GC thread start them much faster than the defaults
(measured here: a local[2] copy job's driver up in ~10 s instead of ~20 s
under load, its first batches sooner too). A test setting, not advice for
jobs. The session's own SparkSession (tests/conftest.py) keeps the defaults:
it runs the whole suite's Spark work.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["QUICK_JVM", "quick_jvm_env"]

QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def quick_jvm_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``SPARK_SUBMIT_OPTS`` carrying QUICK_JVM, so
    every driver JVM spark-submit (or PySpark's launcher) starts from it uses them."""
    result = dict(os.environ if env is None else env)
    result["SPARK_SUBMIT_OPTS"] = f"{result.get('SPARK_SUBMIT_OPTS', '')} {QUICK_JVM}".strip()
    return result

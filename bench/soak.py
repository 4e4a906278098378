#!/usr/bin/env python3
"""Soak (issue 18): load on a broker killed with SIGKILL now and then; every acknowledged
message must be there exactly once at the end.

    .venv/bin/python bench/soak.py                  # 10 minutes
    .venv/bin/python bench/soak.py --kills 200      # exactly 200 kills, load between them
    .venv/bin/python -m pytest tests/broker/test_soak.py -s   # the suite's: 5 kills

Publishes checksummed messages with ids to ``--streams`` streams from ``--publishers``
threads (ack=fsync and ack=write), consumes them with a cursor group, a shared group (two
pull members and a push subscription), a SinkClient exactly-once writer and a Spark
streaming query (local[2], copying every stream through the exactly-once sink), kills the
broker with SIGKILL every 1.5-4 s and restarts it, and at the end checks every
acknowledged message exactly once (tests/support/soak_load.py, the same code as
tests/broker/test_soak.py). Prints a one-line verdict with the figures (messages,
restarts, lost, duplicated, max RSS); exit status 0 on PASS, 1 on FAIL.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))  # the soak, the broker harness, the checks

from soak_load import SoakConfig, run_soak  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="load time (default 10)")
    parser.add_argument("--streams", type=int, default=8, help="publisher streams (default 8)")
    parser.add_argument("--publishers", type=int, default=6, help="publisher threads (6)")
    parser.add_argument("--kills", type=int, default=0, help="exactly this many kill -9s, "
                        "with load between them, instead of --minutes (test_soak.py's form)")
    parser.add_argument("--seed", type=int, default=18, help="seed of the kill moments")
    parser.add_argument("--no-spark", action="store_true", help="leave the Spark query out")
    parser.add_argument("--work-dir", type=Path, help="data dir and checkpoint (default: a "
                        "temporary directory, removed after a PASS)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = None
    if not args.no_spark:  # before any npstream client thread (docs/spark.md's pitfall)
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2]").appName("npstream-soak")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")  # one verdict line, no bars
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory(prefix="npstream-soak-") as scratch:
        work = args.work_dir or Path(scratch)
        result = run_soak(SoakConfig(work_dir=work, seconds=args.minutes * 60, kills=args.kills,
                                     streams=args.streams, publishers=args.publishers,
                                     seed=args.seed, spark=spark))
        print(result.verdict())
        if result.problems() and args.work_dir is None:
            kept = Path(tempfile.mkdtemp(prefix="npstream-soak-failed-"))
            os.rename(scratch, kept / "work")
            os.makedirs(scratch)  # TemporaryDirectory removes it again
            print(f"data dir and logs kept in {kept / 'work'}")
    if spark is not None:
        spark.stop()
    return 1 if result.problems() else 0


if __name__ == "__main__":
    sys.exit(main())

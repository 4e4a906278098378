"""Soak with nothing lost (issue 18), and broker restarts under a Spark query and group consumers.

The soak itself is ``tests/support/soak_load.py`` (shared with ``bench/soak.py``, whose
default run is 10 minutes): publishers with ids and checksummed values, a
cursor group, a shared group with pull members and a push subscription, a
SinkClient exactly-once writer and a Spark streaming copy of every publisher
stream, while the broker is killed with SIGKILL ``NPSTREAM_SOAK_KILLS`` times
(default 5), each at a random moment 1.5-4 s after the last restart and not
before the restarted broker acknowledged publishes and a sink batch, and is
restarted on the same port and data dir. The count does not depend on the
machine's speed (5 took 20 s of load here, 31 s with the checks); the long
run is ``NPSTREAM_SOAK_KILLS=200`` (about 4 s of load per kill) or
``bench/soak.py`` (10 minutes, as many kills as fit; ``--kills N``). This
test asserts the account: every acknowledged message stored exactly once with
a good checksum, the groups at the end of their streams, every sink batch
once, the Spark copy exactly once, exactly the kills asked for, and no
consumer that had to be restarted by hand: the Spark query (on the session's
local[2] SparkSession) and the push subscription reconnect with backoff and go
on by themselves. The figures are printed (run with ``-s``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from soak_load import SoakConfig, run_soak

KILLS = int(os.environ.get("NPSTREAM_SOAK_KILLS", "5"))

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.mark.timeout(300 + 15 * KILLS)
def test_soak_kill_9_nothing_acknowledged_is_lost(spark, tmp_path: Path) -> None:
    result = run_soak(SoakConfig(work_dir=tmp_path, seconds=0, kills=KILLS, streams=3,
                                 seed=int(os.environ.get("NPSTREAM_SOAK_SEED", "18")),
                                 spark=spark))
    print(result.verdict())
    assert result.problems() == [], result.verdict()
    # Reconnecting, not restarting: the query rode out every broker restart.
    assert result.spark_restarts == 0, result.verdict()
    assert result.restarts == KILLS and result.spark_batches > 0, result.verdict()

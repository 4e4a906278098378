"""Which running kernel this process is on: decides whether a broker's files are ours to read.

Local reads (docs/client.md) open the broker's segment files directly. That is
only right when client and broker share one kernel: the kernel's boot id is
random per boot and the same for every process and container on it, so equal
boot ids plus an equal device and inode of the opened file mean "the same
file", where a hostname or a path could match on two different machines.

``NPSTREAM_HOST_ID`` (environment variable, read once per process) replaces
the boot id as this process's identity when it is set and not empty. Give
a client process (e.g. Spark executors: ``spark.executorEnv.NPSTREAM_HOST_ID``)
a value the broker does not have and it behaves as if it ran on another
machine: local reads and staging by file are not tried, every byte goes
over gRPC. Tests use it to run the off-host paths on one machine.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

__all__ = ["HOST_ID_ENV", "boot_id"]

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
HOST_ID_ENV = "NPSTREAM_HOST_ID"


@functools.cache
def boot_id() -> str:
    """This process's host identity: $NPSTREAM_HOST_ID if set, else the kernel's boot id.

    Empty where there is none (not Linux): no local reads then.
    """
    override = os.environ.get(HOST_ID_ENV, "").strip()
    if override:
        return override
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return ""

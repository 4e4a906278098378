"""Which running kernel this process is on: decides whether a broker's files are ours to read.

Local reads (docs/client.md) open the broker's segment files directly. That is
only right when client and broker share one kernel: the kernel's boot id is
random per boot and the same for every process and container on it, so equal
boot ids plus an equal device and inode of the opened file mean "the same
file", where a hostname or a path could match on two different machines.
"""

from __future__ import annotations

import functools
from pathlib import Path

__all__ = ["boot_id"]

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


@functools.cache
def boot_id() -> str:
    """This kernel's boot id; empty where there is none (not Linux): no local reads then."""
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return ""

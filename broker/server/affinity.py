"""Pinning the broker process to a set of CPUs (``[server] cpu_affinity``).

Why: the broker's Python code runs one thread at a time (the GIL), yet every call
crosses several threads (gRPC's poller, a pool worker, the group-commit leader, a
waiting Fetch or Subscribe sender). When those threads sit on different CPUs, each
hand-off is a cross-CPU wake-up and the GIL ping-pongs between cores; on a virtual
machine a cross-CPU wake-up is also an inter-processor interrupt that exits to the
hypervisor. With every thread of the process on one CPU, calls cost less CPU, latency
falls and shared groups drain faster, with no loss of publish, replay or Spark
throughput (docs/benchmarks.md, "CPU affinity", has the figures). Redis offers the
same knob (``server_cpulist``).

Values: ``auto`` (default) pins to one CPU of those the process may use, chosen by
process id so that several brokers on one host spread out; ``none`` leaves placement
to the OS; or a CPU list in the Linux ``cpulist`` format (``taskset -c``): ``"3"``,
``"0,2"``, ``"0-3,8"``.
"""

from __future__ import annotations

import logging
import os

__all__ = ["apply_cpu_affinity", "parse_cpu_affinity"]

log = logging.getLogger(__name__)

AUTO = "auto"
NONE = "none"


def parse_cpu_affinity(value: object) -> str:
    """Normalise the config value: ``auto``, ``none``, or a canonical CPU list."""
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    text = value.strip().lower()
    if text in {AUTO, NONE}:
        return text
    if text in {"", "off", "false"}:
        return NONE
    return _format(_parse_cpu_list(text))


def _parse_cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        first, sep, last = part.strip().partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise ValueError(f"invalid cpu_affinity {text!r}: use auto, none or a CPU list "
                             "such as \"1\", \"0,2\" or \"0-3\"")
        low, high = int(first), int(last) if sep else int(first)
        if high < low:
            raise ValueError(f"invalid cpu_affinity {text!r}: range {part.strip()} is reversed")
        cpus.update(range(low, high + 1))
    return cpus


def _choose(setting: str, allowed: set[int], pid: int) -> set[int] | None:
    """The CPUs to pin to, or None to leave placement alone."""
    if setting == NONE:
        return None
    if setting == AUTO:
        if len(allowed) <= 1:
            return None
        ordered = sorted(allowed)
        return {ordered[pid % len(ordered)]}
    wanted = _parse_cpu_list(setting)
    if not wanted <= allowed:
        raise ValueError(f"cpu_affinity {setting!r} names CPUs this process may not use "
                         f"(allowed: {_format(allowed)})")
    return wanted


def _format(cpus: set[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))


def apply_cpu_affinity(setting: str) -> set[int] | None:
    """Pin every thread of this process; return the CPUs, or None when nothing changed.

    Called before the gRPC server starts its threads; threads that already exist are
    moved too (``/proc/self/task``), since Linux affinity is per thread and only
    inherited by threads created afterwards. Raises ValueError for an explicit CPU list
    this process may not use; ``auto`` never fails (no-op where unsupported).
    """
    if setting == NONE:
        return None
    if not hasattr(os, "sched_setaffinity"):
        if setting != AUTO:
            raise ValueError("cpu_affinity needs Linux (os.sched_setaffinity); set it to none")
        log.info("cpu_affinity=auto: CPU pinning is not supported here; not pinned")
        return None
    allowed = os.sched_getaffinity(0)
    cpus = _choose(setting, allowed, os.getpid())
    if cpus is None:
        return None
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
    log.info("broker pinned to CPU %s of %s (cpu_affinity=%s)", _format(cpus),
             _format(allowed), setting)
    return cpus

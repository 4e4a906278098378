"""Helpers shared by the npstream benchmarks: our broker as a subprocess, stamps, stats, CPU.

The conventions match the peers' benchmarks (../shared/bench/peers/peers_common.py) so our
rows line up with theirs: MB/s counts payload bytes only (1 MB = 1,000,000 bytes); latency
payloads carry ``time.monotonic_ns()`` in their first 8 bytes (little-endian), taken just
before the send call, and the receiving process subtracts it from its own monotonic clock
(CLOCK_MONOTONIC is system-wide on Linux); percentiles use the same nearest-rank rule.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "PUBLISH_BATCH",
    "REPO_ROOT",
    "BrokerUnderTest",
    "CpuMeter",
    "bench_keys",
    "cpu_between",
    "create_bench_stream",
    "descendants_cpu",
    "latency_summary",
    "machine_info",
    "median_of",
    "pct",
    "proc_cpu_s",
    "rate",
    "stamp_of",
    "stamped",
]

REPO_ROOT = Path(__file__).resolve().parents[1]

# How long our broker may take to write its ready file before the bench gives up.
BROKER_START_TIMEOUT_S = 60.0
# SIGTERM grace before SIGKILL when the bench stops our broker.
BROKER_STOP_TIMEOUT_S = 30.0

# Bench streams turn off size-based retention: the broker's default (1 GiB per stream)
# would delete the head of a 10 M-message stream while it is being read.
BENCH_STREAM_MAX_BYTES = 0

_STAMP = struct.Struct("<Q")

# Rows per publish_batch when a bench fills a stream (not timed); the trivial server
# stores its keyed rows in batches of as many, as our broker stores those publishes.
PUBLISH_BATCH = 10_000

# Seed of the keys drawn at random for keyed bench streams (bench_keys).
KEY_SEED = 16


def bench_keys(n: int, keys: int, random_keys: bool) -> list[bytes]:
    """The keys of a keyed bench stream's ``n`` messages: ``k0..k<keys-1>`` round-robin, or
    drawn at random (seeded), so our broker and the trivial server get the same data."""
    if random_keys:
        draw = random.Random(KEY_SEED)
        return [b"k%d" % draw.randrange(keys) for _ in range(n)]
    return [b"k%d" % (i % keys) for i in range(n)]


def create_bench_stream(client: Any, name: str, schema: str | None = None) -> None:
    """Create ``name`` with broker defaults except no size limit (see BENCH_STREAM_MAX_BYTES).

    ``schema``: a value schema (DDL) for a typed stream; None: untyped.
    """
    if schema is None:
        client.create_stream(name, max_bytes=BENCH_STREAM_MAX_BYTES)
    else:
        client.create_stream(name, max_bytes=BENCH_STREAM_MAX_BYTES, schema=schema)


def stamped(size: int, filler: bytes) -> bytes:
    """A payload of ``size`` bytes whose first 8 bytes are the send time (monotonic ns)."""
    return _STAMP.pack(time.monotonic_ns()) + filler[8:size]


def stamp_of(data: bytes) -> int:
    return _STAMP.unpack_from(data, 0)[0]


def rate(n: int, size: float, seconds: float) -> dict[str, Any]:
    return {
        "messages": n,
        "seconds": round(seconds, 3),
        "msgs_per_s": round(n / seconds, 1) if seconds > 0 else None,
        "mb_per_s": round(n * size / 1e6 / seconds, 2) if seconds > 0 else None,
    }


def pct(sorted_vals: list[float], q: float) -> float | None:
    """Nearest-rank percentile, the rule the peers' scripts use."""
    if not sorted_vals:
        return None
    k = min(len(sorted_vals) - 1, max(0, round(q / 100.0 * (len(sorted_vals) - 1))))
    return sorted_vals[k]


def latency_summary(lat_ns: Iterable[int], sent: int, send_seconds: float,
                    method: str) -> dict[str, Any]:
    v = sorted(x / 1e6 for x in lat_ns)

    def r(q: float) -> float | None:
        p = pct(v, q)
        return round(p, 3) if p is not None else None

    return {
        "method": method,
        "sent": sent,
        "received": len(v),
        "send_rate_achieved": round(sent / send_seconds, 1) if send_seconds > 0 else None,
        "p50_ms": r(50),
        "p90_ms": r(90),
        "p99_ms": r(99),
        "max_ms": round(v[-1], 3) if v else None,
    }


def median_of(runs: list[dict[str, Any]], field: str) -> float | None:
    vals = [r[field] for r in runs if isinstance(r, dict) and r.get(field) is not None]
    return round(statistics.median(vals), 3) if vals else None


def proc_cpu_s(pid: int | None) -> float | None:
    """utime+stime (s) of a process, from /proc; None if unreadable."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _proc_stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, utime+stime+cutime+cstime in s) of a process, from /proc; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        return int(fields[1]), ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def descendants_cpu(root: int, exclude: Iterable[int] = ()) -> dict[int, float]:
    """CPU seconds so far of every descendant of ``root`` (pid -> s), minus ``exclude``'s trees.

    Each process counts its own CPU and that of its children it has reaped. For the
    difference between two calls use ``cpu_between``.
    """
    stats = {int(p): st for p in os.listdir("/proc") if p.isdigit()
             for st in [_proc_stat(p)] if st is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _cpu) in stats.items():
        children.setdefault(ppid, []).append(pid)
    skip = set(exclude)
    out: dict[int, float] = {}
    todo = [c for c in children.get(root, []) if c not in skip]
    while todo:
        pid = todo.pop()
        out[pid] = stats[pid][1]
        todo.extend(c for c in children.get(pid, []) if c not in skip)
    return out


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two ``descendants_cpu`` snapshots (new processes in full)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def _machine_busy_s() -> float:
    """Non-idle CPU seconds of the whole machine so far (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _cpu_pressure_s() -> float | None:
    """Seconds in which some runnable task waited for a core (Linux PSI), None without PSI."""
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()
    except OSError:
        return None
    return int(some[-1].partition("=")[2]) / 1e6


class CpuMeter:
    """CPU seconds used during a phase by this process, the broker process and the machine.

    Also the machine's CPU pressure (the share of the phase in which some
    runnable thread waited for a core): CPU seconds alone do not say whether
    the cores were the limit, since processes that hand work back and forth
    leave cores idle between hand-offs even when each wants more.
    """

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid
        self.client_s = 0.0
        self.server_s: float | None = None
        self.machine_s = 0.0
        self.pressure_s: float | None = None
        self.wall_s = 0.0

    def __enter__(self) -> CpuMeter:
        self._c0 = time.process_time()
        self._s0 = proc_cpu_s(self.server_pid)
        self._m0 = _machine_busy_s()
        self._p0 = _cpu_pressure_s()
        self._w0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._w0
        self.client_s = time.process_time() - self._c0
        s1 = proc_cpu_s(self.server_pid)
        self.server_s = s1 - self._s0 if s1 is not None and self._s0 is not None else None
        self.machine_s = _machine_busy_s() - self._m0
        p1 = _cpu_pressure_s()
        self.pressure_s = p1 - self._p0 if p1 is not None and self._p0 is not None else None

    def as_dict(self) -> dict[str, Any]:
        wall = self.wall_s or 1e-9
        return {
            "client_cpu_s": round(self.client_s, 2),
            "server_cpu_s": round(self.server_s, 2) if self.server_s is not None else None,
            "server_cores_busy": round(self.server_s / wall, 2)
            if self.server_s is not None else None,
            "machine_cores_busy": round(self.machine_s / wall, 2),
            "cpu_pressure": round(self.pressure_s / wall, 2)
            if self.pressure_s is not None else None,
        }


def machine_info() -> dict[str, Any]:
    return {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


class BrokerUnderTest:
    """Our broker as a subprocess on a temp data dir and a free loopback port.

    Started with the interpreter running the bench (the one npstream is installed in), the
    same way an operator starts it: ``python -m npstream.broker``. Used as a context manager;
    the temp dir is removed afterwards unless ``keep`` is set.
    """

    def __init__(self, *, extra_args: list[str] | None = None, keep: bool = False) -> None:
        self.extra_args = list(extra_args or [])
        self.keep = keep
        self.dir = Path(tempfile.mkdtemp(prefix="npstream-bench-"))
        self.data_dir = self.dir / "data"
        self.log_path = self.dir / "broker.log"
        self.address = ""
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def __enter__(self) -> BrokerUnderTest:
        ready = self.dir / "ready"
        cmd = [sys.executable, "-m", "npstream.broker", "--data-dir", str(self.data_dir),
               "--host", "127.0.0.1", "--port", "0", "--ready-file", str(ready),
               *self.extra_args]
        env = {**os.environ, "NPSTREAM_METRICS_PORT": "0"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + BROKER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = ready.read_text().strip() if ready.exists() else ""
            if text:
                self.address = text
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"npstream broker exited with {self.proc.returncode}; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.05)
        self._stop()
        raise TimeoutError(f"npstream broker not ready after {BROKER_START_TIMEOUT_S:.0f} s; "
                           f"log {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def _stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(BROKER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def __exit__(self, *exc: object) -> None:
        self._stop()
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

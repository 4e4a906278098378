"""Run the peers' benchmark scripts (Redis Streams, NATS JetStream) from ../shared/bench/peers.

The scripts are not copied into this repo: they live in the shared/ folder beside the clone
and are called in place, one peer at a time (start_peers.sh <peer>, bench, stop_peers.sh),
so an idle peer never steals CPU from the one being measured. Each bench script prints one
JSON line, which is returned as a dict.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench_common import REPO_ROOT

__all__ = [
    "PEERS",
    "PeersMissing",
    "PeersNotInstalled",
    "check_peers",
    "peer_running",
    "peers_dir",
    "peers_python",
    "run_peer_script",
]

# Peer name -> (bench script, server binary that start_peers.sh runs).
PEERS: dict[str, tuple[str, str]] = {
    "redis": ("bench_redis.py", "redis-server"),
    "nats": ("bench_nats.py", "nats-server"),
}
# Seconds to let a freshly started peer settle before measuring (run_all.sh does the same).
PEER_SETTLE_S = 2.0
# Wall-clock cap for one bench script run; phases also cap themselves (--phase-timeout).
PEER_SCRIPT_TIMEOUT_S = 1800.0


class PeersMissing(RuntimeError):
    """The shared/bench/peers folder is not beside the clone."""


class PeersNotInstalled(RuntimeError):
    """The peer servers or their Python clients are not installed on this machine."""


def peers_dir() -> Path:
    return REPO_ROOT.parent / "shared" / "bench" / "peers"


def peers_python() -> Path:
    """The interpreter with the peers' clients (env PY, as in run_all.sh)."""
    return Path(os.environ.get("PY", "/tmp/peersvenv/bin/python"))


def check_peers(names: list[str]) -> Path:
    """Return the peers folder, or raise saying what is missing and how to install it."""
    folder = peers_dir()
    if not (folder / "start_peers.sh").exists():
        raise PeersMissing(
            f"peer benchmarks not found at {folder}: the shared/ folder (with bench/peers/) "
            "must sit beside this clone; run with --skip-peers to measure npstream alone"
        )
    missing = [PEERS[n][1] for n in names if shutil.which(PEERS[n][1]) is None
               and not Path("/usr/sbin", PEERS[n][1]).exists()]
    py = peers_python()
    if not py.exists():
        missing.append(f"{py} (the peers' Python clients)")
    if missing:
        rel = os.path.relpath(folder / "setup_peers.sh", Path.cwd())
        raise PeersNotInstalled(
            f"peers not installed (missing: {', '.join(missing)}); install them with "
            f"`bash {rel}`"
        )
    return folder


def _sh(folder: Path, script: str, *args: str) -> None:
    proc = subprocess.run(["bash", str(folder / script), *args], capture_output=True,
                          text=True, timeout=180)
    if proc.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(args)} failed ({proc.returncode}): "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")


@contextmanager
def peer_running(name: str) -> Iterator[int | None]:
    """Start one peer alone on a fresh data dir; yield its pid; always stop it."""
    folder = check_peers([name])
    _sh(folder, "start_peers.sh", name)
    try:
        time.sleep(PEER_SETTLE_S)
        pid_file = Path("/tmp/peers") / f"{name}.pid"
        yield int(pid_file.read_text().strip()) if pid_file.exists() else None
    finally:
        _sh(folder, "stop_peers.sh")


def run_peer_script(script: str | Path, args: list[str], *, folder: Path | None = None,
                    timeout: float = PEER_SCRIPT_TIMEOUT_S) -> dict[str, Any]:
    """Run one peer bench script with the peers' interpreter; return its JSON line.

    ``script`` is a file name inside the peers folder or an absolute path (our own
    peer-side scripts, which import peers_common from that folder via PYTHONPATH).
    """
    folder = folder or check_peers([])
    path = Path(script) if Path(script).is_absolute() else folder / script
    env = {**os.environ, "PYTHONPATH": str(folder)}
    proc = subprocess.run([str(peers_python()), str(path), *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{path.name} {' '.join(args)} failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    if proc.stderr.strip():
        sys.stderr.write(proc.stderr[-2000:])
    return json.loads(lines[-1])

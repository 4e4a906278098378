"""One etcd process on loopback, for ``npstream cluster local`` and the tests.

A cluster of brokers coordinates through etcd (docs/scaling.md); on one
machine a single etcd member is enough. It runs Debian's ``etcd`` binary
(``make`` installs ``etcd-server`` when absent) with its own data dir and
loopback ports, and is ready once its ``/health`` answers.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

__all__ = ["ETCD_BINARY", "LocalEtcd", "free_port"]

ETCD_BINARY = "etcd"
START_TIMEOUT_S = 30.0


def free_port() -> int:
    """A loopback port nobody listens on now (etcd cannot report a port 0 it bound)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalEtcd:
    """A one-member etcd cluster on 127.0.0.1; ``endpoint`` is ``http://127.0.0.1:PORT``."""

    def __init__(self, data_dir: Path, *, client_port: int = 0, log_path: Path | None = None,
                 binary: str = ETCD_BINARY) -> None:
        self.data_dir = Path(data_dir)
        self.client_port = client_port
        self.log_path = log_path or self.data_dir.parent / f"{self.data_dir.name}-etcd.log"
        self.binary = binary
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> LocalEtcd:
        """Start etcd and wait until it is healthy; RuntimeError with its log otherwise."""
        path = shutil.which(self.binary)
        if path is None:
            raise RuntimeError(f"'{self.binary}' is not installed: `make setup` installs it "
                               f"(Debian's etcd-server: apt-get install etcd-server)")
        self.client_port = self.client_port or free_port()
        peer = f"http://127.0.0.1:{free_port()}"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [path, "--name", "npstream", "--data-dir", str(self.data_dir),
               "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", f"npstream={peer}", "--logger", "zap",
               "--log-outputs", "stderr", "--log-level", "warn"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "ETCD_UNSUPPORTED_ARCH": ""},
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}:\n"
                                   f"{self.log_text()[-3000:]}")
            if self.healthy():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"etcd not healthy after {timeout_s:g}s:\n{self.log_text()[-3000:]}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1) as reply:
                return bool(json.loads(reply.read()).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it does not stop in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

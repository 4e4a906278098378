"""Test harness: a real broker process on a loopback ephemeral port.

Tests never mock the broker: ``BrokerProcess`` runs ``python -m npstream.broker``
with its own data dir, waits for the ready file the broker writes once it
serves, and can stop (SIGTERM), kill -9 and restart it on the same data dir
and port.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc

from npstream.proto import pb, pb_grpc

__all__ = ["REPO_ROOT", "SUPPORT_DIR", "BrokerProcess", "build_wheel", "first_publishes",
           "write_tokens_file"]

# The repository checkout the tests run from (docs, examples, bench, conf).
REPO_ROOT = Path(__file__).resolve().parents[2]
# The test helpers' folder (tests/support): scripts some tests run by path.
SUPPORT_DIR = Path(__file__).resolve().parent


def write_tokens_file(path: Path, admin: str, reader: str, readable: str,
                      writable: str | None = None) -> list[str]:
    """A tokens file (docs/security.md) with an admin token and a reader of ``readable``.

    ``admin`` may do everything on every stream; ``reader`` may only read
    streams matching the glob ``readable`` (and write those matching
    ``writable``, when given). Returns the broker arguments that load it.
    """
    write = f'write = ["{writable}"]\n' if writable is not None else ""
    path.write_text(f"""
[[tokens]]
name = "admin"
token = "{admin}"
admin = ["*"]
read = ["*"]
write = ["*"]

[[tokens]]
name = "reader"
token = "{reader}"
read = ["{readable}"]
{write}""")
    return ["--tokens-file", str(path)]


def first_publishes(address: str, names: list[str], calls: int) -> list[str]:
    """One message to each new stream of ``names`` (creating it), ack=fsync, over ``calls``
    concurrent PublishStream calls; returns the names acknowledged, each checked to be
    the stream's first message (offset 0)."""
    acked: list[str] = []
    lock = threading.Lock()

    def produce(part: list[str]) -> None:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.StreamServiceStub(channel)
            requests = (pb.PublishRequest(stream=n, messages=[pb.Message(value=n.encode())],
                                          ack=pb.ACK_FSYNC) for n in part)
            for name, reply in zip(part, stub.PublishStream(requests), strict=True):
                assert (reply.first_offset, reply.stored_count) == (0, 1)
                with lock:
                    acked.append(name)

    threads = [threading.Thread(target=produce, args=(names[k::calls],)) for k in range(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return acked


class BrokerProcess:
    """One broker process; ``address`` is "127.0.0.1:PORT" once started."""

    def __init__(
        self,
        data_dir: Path,
        *,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        config: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.extra_env = dict(env or {})
        self.extra_args = list(args or [])
        self.config = config
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> BrokerProcess:
        ready = self.data_dir.parent / f"{self.data_dir.name}.ready"
        ready.unlink(missing_ok=True)
        cmd = [
            sys.executable, "-m", "npstream.broker",
            "--data-dir", str(self.data_dir),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--ready-file", str(ready),
            *self.extra_args,
        ]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        env = {**os.environ, "NPSTREAM_METRICS_PORT": "0", **self.extra_env}
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready.exists() and ready.read_text().strip():
                self.port = int(ready.read_text().strip().rsplit(":", 1)[1])
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"broker exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}"
                )
            time.sleep(0.02)
        self.kill()
        raise TimeoutError(f"broker not ready after {timeout}s:\n{self.log_text()[-4000:]}")

    @property
    def http_address(self) -> str:
        """``http://127.0.0.1:PORT`` of the metrics and web console port (from the log)."""
        found = re.findall(r"metrics=(https?://\S+)/metrics", self.log_text())
        assert found, f"no metrics address in the broker log:\n{self.log_text()[-2000:]}"
        return found[-1]

    @property
    def kafka_address(self) -> str:
        """``127.0.0.1:PORT`` of the Kafka listener (``--kafka-port``; from the log)."""
        found = re.findall(r" kafka=(\S+:\d+) ", self.log_text())
        assert found, f"no kafka address in the broker log:\n{self.log_text()[-2000:]}"
        return found[-1]

    def metrics(self, token: str | None = None) -> dict[str, float]:
        """Every sample of the broker's Prometheus endpoint (address from its start-up log).

        ``token``: sent as a bearer token (a broker with auth on needs one).
        """
        request = urllib.request.Request(self.http_address + "/metrics")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        text = urllib.request.urlopen(request, timeout=10).read().decode()
        samples = (line.rpartition(" ") for line in text.splitlines()
                   if line and not line.startswith("#"))
        return {key: float(value) for key, _, value in samples}

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: the broker flushes everything and exits 0."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """kill -9: no flush, no cleanup; what was acknowledged must survive."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, *, hard: bool = False) -> BrokerProcess:
        """Restart on the same data dir and port (hard: kill -9 first)."""
        if hard:
            self.kill()
        else:
            self.stop()
        return self.start()

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def rss(self) -> int:
        """The process's resident memory in bytes (VmRSS of /proc/PID/status)."""
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")


def build_wheel(work: Path) -> tuple[Path, str]:
    """Build the wheel from a copy of the packaged sources; return it and pip's output.

    A copy, so that no build/ or egg-info lands in the shared tree; the output
    (pip -v, which shows the build backend's messages) lets tests check that
    the build prints no setuptools warnings.
    """
    source = work / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO_ROOT / name).exists():
            shutil.copy2(REPO_ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for package_root in ("connector", "broker", "proto"):  # pyproject's package-dir
        shutil.copytree(REPO_ROOT / package_root, source / package_root, ignore=ignore)
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps",
                             "--no-build-isolation", "-w", str(work / "dist"), str(source)],
                            check=True, timeout=300, capture_output=True, text=True)
    (wheel,) = (work / "dist").glob("npstream-*.whl")
    return wheel, result.stdout + result.stderr


_SHARED_ETCD: list[object] = []


def shared_etcd() -> object:
    """One etcd (npstream.cli.local_etcd.LocalEtcd) for the whole test session, started on
    first use and stopped when the session's process exits; clusters keep apart by their
    cluster name (key prefix). The ``etcd`` fixture and tests/support/cluster_members.py use it."""
    if not _SHARED_ETCD:
        import atexit
        import tempfile

        from npstream.cli.local_etcd import LocalEtcd

        root = Path(tempfile.mkdtemp(prefix="npstream-test-etcd-"))
        etcd = LocalEtcd(root / "data").start()
        atexit.register(lambda: (etcd.stop(), shutil.rmtree(root, ignore_errors=True)))
        _SHARED_ETCD.append(etcd)
    return _SHARED_ETCD[0]

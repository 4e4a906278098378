"""One Spark standalone cluster and one Spark Connect server, shared by the tests of this folder.

Both are started from the installed PySpark (its bin/spark-class and
bin/spark-submit), on loopback, with small JVMs, once per test session, and
stopped at its end:

- ``standalone_cluster``: a Master and two Workers (1 core, 1g each) in JVMs
  of their own; ``submit()`` runs ``spark-submit --master spark://...`` in a
  scratch directory, with 512m driver and executors. Executors run in the
  workers' work directories, in JVMs and Python workers of their own: what a
  task needs must travel in its partition, what the driver needs in the
  commit messages.
- ``connect_server``: ``SparkConnectServer`` (``local[2]``) on a free port,
  whose Python workers run this interpreter (PYSPARK_PYTHON), which has
  npstream installed: ``format("npstream")`` is found by Spark's own
  discovery, with no registration call.

The JVMs are started in process groups of their own and stopped by their
group id (the workers' executors with them).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyspark
import pytest

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
SPARK_SUBMIT = SPARK_HOME / "bin" / "spark-submit"
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
WORKERS = 2
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "512m"
DRIVER_MEMORY = "512m"
CONNECT_SERVER_MEMORY = "768m"
# Master and Worker are small daemons; Spark's default heap for them is 1g.
DAEMON_MEMORY = "256m"
# The JVMs here live for seconds to a minute on 2 shared cores: the quick JIT
# and one GC thread start them faster than the defaults (measured: a copy job
# submit ~10-20% faster). Test settings only; not a recommendation for jobs.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
START_TIMEOUT = 90.0


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of every Spark process started here: loopback, this interpreter."""
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    for name in ("SPARK_CONF_DIR", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED",
                 "NPSTREAM_BROKER"):
        env.pop(name, None)
    env.update(extra)
    return env


@dataclass
class Daemon:
    """A Spark JVM started by a fixture, with its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, pattern: str, count: int = 1, timeout: float = START_TIMEOUT
                 ) -> re.Match[str]:
        """The ``count``-th match of ``pattern`` in the log, waiting for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = list(re.finditer(pattern, self.text()))
            if len(found) >= count:
                return found[count - 1]
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                                   f"{self.text()[-4000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"{self.name}: no {pattern!r} after {timeout}s:\n"
                           f"{self.text()[-4000:]}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the daemon's process group (SIGKILL if it lingers)."""
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def start_daemon(name: str, cmd: list[str], log: Path, env: dict[str, str],
                 cwd: Path) -> Daemon:
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
    return Daemon(name, proc, log)


@dataclass
class StandaloneCluster:
    """A running Master and its Workers; ``url`` is spark://127.0.0.1:PORT."""

    url: str
    root: Path
    daemons: list[Daemon] = field(default_factory=list)

    def submit(self, script: Path | str, *args: str, conf: dict[str, str] | None = None,
               env: dict[str, str] | None = None, cwd: Path | None = None,
               timeout: float = 240) -> subprocess.CompletedProcess[str]:
        """spark-submit ``script`` to the cluster (client mode); fails the test if it fails."""
        settings = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                    "spark.executor.memory": EXECUTOR_MEMORY, "spark.executor.cores": "1",
                    "spark.sql.session.timeZone": "UTC",
                    "spark.driver.extraJavaOptions": QUICK_JVM,
                    "spark.executor.extraJavaOptions": QUICK_JVM, **(conf or {})}
        cmd = [str(SPARK_SUBMIT), "--master", self.url, "--driver-memory", DRIVER_MEMORY]
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        cmd += [str(script), *args]
        scratch = cwd or self.root / "submit"
        scratch.mkdir(exist_ok=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=scratch,
                              env=spark_env(**(env or {})), timeout=timeout)
        assert proc.returncode == 0, (
            f"spark-submit {script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
            f"{proc.stderr[-6000:]}\nexecutors:\n{self.executor_logs()[-6000:]}")
        return proc

    def executor_logs(self) -> str:
        """The end of every executor's stderr so far (for failure messages)."""
        return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.root.glob("worker-*/app-*/*/stderr")))


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A Master and two Workers (1 core, 1g each) on loopback, for the whole session."""
    root = tmp_path_factory.mktemp("standalone")
    conf_dir = root / "conf"  # empty: Spark's defaults, INFO logs into the daemons' files
    conf_dir.mkdir()
    env = spark_env(SPARK_CONF_DIR=str(conf_dir), SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
                    SPARK_DAEMON_JAVA_OPTS=QUICK_JVM, SPARK_LOCAL_DIRS=str(root / "local"),
                    # No REST submission server (it would take the fixed port 6066).
                    SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
    daemons: list[Daemon] = []
    try:
        master = start_daemon(
            "master", [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master",
                       "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
            root / "master.log", env, root)
        daemons.append(master)
        url = master.wait_for(r"Starting Spark master at (spark://[\d.]+:\d+)").group(1)
        for n in range(1, WORKERS + 1):
            work = root / f"worker-{n}"
            work.mkdir()
            daemons.append(start_daemon(
                f"worker-{n}", [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker",
                                "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                                "--cores", "1", "--memory", WORKER_MEMORY,
                                "--work-dir", str(work), url],
                root / f"worker-{n}.log", env, root))
        master.wait_for(r"Registering worker", count=WORKERS)
        yield StandaloneCluster(url, root, daemons)
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ConnectServer:
    """A running Spark Connect server; ``url`` is sc://127.0.0.1:PORT."""

    url: str
    daemon: Daemon


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """SparkConnectServer on loopback (local[2]), its Python workers on this interpreter."""
    root = tmp_path_factory.mktemp("connect")
    conf_dir = root / "conf"
    conf_dir.mkdir()
    env = spark_env(SPARK_CONF_DIR=str(conf_dir), SPARK_LOCAL_DIRS=str(root / "local"))
    daemon: Daemon | None = None
    try:
        for _attempt in range(3):  # the free port may be taken before the server binds it
            port = free_port()
            daemon = start_daemon("connect-server", [
                str(SPARK_SUBMIT), "--class", CONNECT_SERVER_CLASS,
                "--name", "npstream-tests-connect", "--master", "local[2]",
                "--driver-memory", CONNECT_SERVER_MEMORY,
                "--conf", "spark.ui.enabled=false",
                "--conf", "spark.sql.shuffle.partitions=2",
                "--conf", "spark.sql.session.timeZone=UTC",
                "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf", f"spark.connect.grpc.binding.port={port}",
            ], root / f"connect-{port}.log", env, root)
            try:
                daemon.wait_for(r"Spark Connect server started at")
            except RuntimeError:
                if "Address already in use" in daemon.text() or "BindException" in daemon.text():
                    continue
                raise
            yield ConnectServer(f"sc://127.0.0.1:{port}", daemon)
            return
        raise RuntimeError(f"the Connect server found no free port:\n{daemon and daemon.text()}")
    finally:
        if daemon is not None:
            daemon.stop()

"""Shared fixtures: one broker process per test module, one SparkSession and one etcd
per session."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import BrokerProcess, shared_etcd
from integration_marks import mark_integration

# Spark starts Python workers with `python3` from PATH unless told otherwise;
# they must run this interpreter, which has npstream and pyarrow installed.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``integration`` every test that starts a process (support/integration_marks.py)."""
    mark_integration(items)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A real broker process shared by the tests of one module."""
    proc = BrokerProcess(tmp_path_factory.mktemp("broker") / "data").start()
    yield proc
    proc.stop()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[object]:
    """Start extra brokers with their own env/args; all are killed at teardown."""
    started: list[BrokerProcess] = []

    def make(name: str = "data", **kwargs: object) -> BrokerProcess:
        proc = BrokerProcess(tmp_path / name, **kwargs).start()  # type: ignore[arg-type]
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.kill()


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[object]:
    from npstream import Client

    with Client(broker.address) as c:
        yield c


@pytest.fixture
def stream_name(request: pytest.FixtureRequest) -> str:
    """A stream name unique to this test."""
    base = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:40]
    return f"{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def etcd() -> Iterator[object]:
    """One real etcd (npstream.cli.local_etcd.LocalEtcd) on loopback for the whole
    session; tests keep apart by key prefix (cluster name). Its ``endpoint`` is the
    ``--etcd`` value."""
    yield shared_etcd()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local[2] SparkSession for the whole test session."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("npstream-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    yield session
    session.stop()


@dataclass(frozen=True)
class TlsFiles:
    """PEM files made at test time: a CA, the broker's certificate, clients' certificates."""

    ca: Path            # the CA that signed server and client certificates
    server_cert: Path   # for localhost and 127.0.0.1
    server_key: Path
    client_cert: Path   # signed by ``ca``
    client_key: Path
    stranger_cert: Path  # a client certificate of another CA
    stranger_key: Path

    @property
    def broker_env(self) -> dict[str, str]:
        """TLS with client certificates required (mutual TLS)."""
        return {"NPSTREAM_TLS_CERT_FILE": str(self.server_cert),
                "NPSTREAM_TLS_KEY_FILE": str(self.server_key),
                "NPSTREAM_TLS_CLIENT_CA_FILE": str(self.ca)}


@pytest.fixture
def tls_files(tmp_path: Path) -> TlsFiles:
    """Certificates from trustme (a Python library: no `openssl` CLI needed)."""
    import trustme

    ca, other_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("client.npstream.test")
    stranger = other_ca.issue_cert("stranger.npstream.test")
    folder = tmp_path / "tls"
    folder.mkdir()
    files = TlsFiles(*(folder / name for name in (
        "ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem",
        "stranger.pem", "stranger-key.pem")))
    ca.cert_pem.write_to_path(str(files.ca))
    for issued, cert, key in ((server, files.server_cert, files.server_key),
                              (client, files.client_cert, files.client_key),
                              (stranger, files.stranger_cert, files.stranger_key)):
        issued.private_key_pem.write_to_path(str(key))
        for pem in issued.cert_chain_pems:
            pem.write_to_path(str(cert), append=True)
    return files

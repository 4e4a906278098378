"""Auth token and TLS between the SDK and a real broker process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from npstream import BrokerUnavailable, Client, Unauthenticated

TOKEN = "s3cret-token"


@pytest.fixture
def token_broker(broker_factory):
    return broker_factory("token", env={"NPSTREAM_AUTH_TOKEN": TOKEN})


@pytest.fixture
def tls_files(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )
    return cert, key


def test_token_broker_without_token_raises_unauthenticated(token_broker):
    with Client(token_broker.address) as client, pytest.raises(Unauthenticated):
        client.list_streams()


def test_token_broker_wrong_token_raises_unauthenticated(token_broker):
    with Client(token_broker.address, "wrong") as client, pytest.raises(Unauthenticated):
        client.create_stream("s")


def test_token_broker_right_token_works_for_sdk_and_cli(token_broker):
    with Client(token_broker.address, TOKEN) as client:
        assert client.publish("s", "x").offset == 0
    env = {**os.environ, "NPSTREAM_TOKEN": TOKEN}
    result = subprocess.run(
        [sys.executable, "-m", "npstream.cli", "streams", "describe", "s", "--json",
         "--broker", token_broker.address], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert '"end_offset": 1' in result.stdout


def test_tls_broker_with_root_certificate_works(broker_factory, tls_files):
    cert, key = tls_files
    broker = broker_factory("tls", env={"NPSTREAM_TLS_CERT_FILE": str(cert),
                                        "NPSTREAM_TLS_KEY_FILE": str(key)})
    with Client(broker.address, root_certificates=cert.read_bytes()) as client:
        assert client.publish("s", "secure").offset == 0
        assert client.fetch("s", 0).column("value").to_pylist() == [b"secure"]


def test_tls_broker_plaintext_or_untrusted_client_fails_naming_address(broker_factory, tls_files):
    cert, key = tls_files
    broker = broker_factory("tls", env={"NPSTREAM_TLS_CERT_FILE": str(cert),
                                        "NPSTREAM_TLS_KEY_FILE": str(key)})
    for client in (Client(broker.address, retry_deadline=0.3),
                   Client(broker.address, tls=True, retry_deadline=0.3)):
        with client, pytest.raises(BrokerUnavailable, match=f"broker at {broker.address}"):
            client.list_streams()

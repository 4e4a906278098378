"""Auth token, TLS and mutual TLS between the SDK (and CLI) and a real broker process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from npstream import BrokerUnavailable, Client, InvalidArgument, Unauthenticated

TOKEN = "s3cret-token"


@pytest.fixture
def token_broker(broker_factory):
    return broker_factory("token", env={"NPSTREAM_AUTH_TOKEN": TOKEN})


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
    broker = broker_factory("tls", env={"NPSTREAM_TLS_CERT_FILE": str(tls_files.server_cert),
                                        "NPSTREAM_TLS_KEY_FILE": str(tls_files.server_key)})
    with Client(broker.address, root_certificates=tls_files.ca.read_bytes()) as client:
        assert client.publish("s", "secure").offset == 0
        assert client.fetch("s", 0).column("value").to_pylist() == [b"secure"]


def test_tls_broker_plaintext_or_untrusted_client_fails_naming_address(broker_factory, tls_files):
    broker = broker_factory("tls", env={"NPSTREAM_TLS_CERT_FILE": str(tls_files.server_cert),
                                        "NPSTREAM_TLS_KEY_FILE": str(tls_files.server_key)})
    for client in (Client(broker.address, retry_deadline=0.3),
                   Client(broker.address, tls=True, retry_deadline=0.3)):
        with client, pytest.raises(BrokerUnavailable, match=f"broker at {broker.address}"):
            client.list_streams()


def test_mutual_tls_client_certificate_accepted_missing_or_foreign_refused(broker_factory,
                                                                          tls_files):
    broker = broker_factory("mtls", env={**tls_files.broker_env, "NPSTREAM_AUTH_TOKEN": TOKEN})
    root = tls_files.ca.read_bytes()
    with Client(broker.address, TOKEN, root_certificates=root,
                client_cert=tls_files.client_cert.read_bytes(),
                client_key=tls_files.client_key.read_bytes()) as client:
        assert client.publish("s", "mutual").offset == 0
        assert client.fetch("s", 0).column("value").to_pylist() == [b"mutual"]
    for extra in ({}, {"client_cert": tls_files.stranger_cert.read_bytes(),
                       "client_key": tls_files.stranger_key.read_bytes()}):
        with Client(broker.address, TOKEN, root_certificates=root, retry_deadline=0.3,
                    **extra) as client, pytest.raises(BrokerUnavailable):
            client.list_streams()


def test_client_cert_and_key_go_together():
    for extra in ({"client_cert": b"cert"}, {"client_key": b"key"}):
        with pytest.raises(InvalidArgument, match="client_cert and client_key go together"):
            Client("127.0.0.1:1", **extra)


def test_cli_connects_with_client_certificate(broker_factory, tls_files):
    broker = broker_factory("mtls", env=tls_files.broker_env)
    base = [sys.executable, "-m", "npstream.cli", "streams", "create", "cli-mtls",
            "--broker", broker.address, "--ca-file", str(tls_files.ca), "--retry-deadline",
            "0.5"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPSTREAM_")}
    ok = subprocess.run([*base, "--client-cert", str(tls_files.client_cert),
                         "--client-key", str(tls_files.client_key), "--json"],
                        capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert '"name": "cli-mtls"' in ok.stdout
    refused = subprocess.run(base, capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 1
    assert f"broker at {broker.address} is unavailable" in refused.stderr
    via_env = subprocess.run(
        [sys.executable, "-m", "npstream.cli", "streams", "describe", "cli-mtls",
         "--broker", broker.address],
        capture_output=True, text=True, timeout=60,
        env={**env, "NPSTREAM_CA_FILE": str(tls_files.ca),
             "NPSTREAM_CLIENT_CERT": str(tls_files.client_cert),
             "NPSTREAM_CLIENT_KEY": str(tls_files.client_key)})
    assert via_env.returncode == 0, via_env.stderr


def test_cli_refuses_a_client_cert_without_key_or_an_unreadable_file(tls_files, tmp_path):
    base = [sys.executable, "-m", "npstream.cli", "streams", "list", "--broker", "127.0.0.1:1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPSTREAM_")}
    alone = subprocess.run([*base, "--client-cert", str(tls_files.client_cert)],
                           capture_output=True, text=True, env=env, timeout=60)
    assert alone.returncode == 2
    assert "--client-cert and --client-key go together" in alone.stderr
    missing = subprocess.run([*base, "--ca-file", str(tmp_path / "nope.pem")],
                             capture_output=True, text=True, env=env, timeout=60)
    assert missing.returncode == 2
    assert "--ca-file" in missing.stderr and "cannot read the file" in missing.stderr

"""Connection options (token, tls, tlsRootCertificates) of the reader against real brokers."""

from __future__ import annotations

import subprocess

import pytest

from npstream import Client, Unauthenticated
from npstream.spark.options import parse_read_options
from npstream.spark.range_reader import RangePartition
from npstream.spark.stream_reader import NpstreamStreamReader

TOKEN = "reader-token"


@pytest.fixture
def secure_broker(broker_factory, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )
    broker = broker_factory("secure", env={"NPSTREAM_AUTH_TOKEN": TOKEN,
                                           "NPSTREAM_TLS_CERT_FILE": str(cert),
                                           "NPSTREAM_TLS_KEY_FILE": str(key)})
    with Client(broker.address, TOKEN, root_certificates=cert.read_bytes()) as client:
        client.publish_batch("s", [{"value": b"a"}, {"value": b"b"}])
    return broker, cert


def reader(options: dict[str, str]) -> NpstreamStreamReader:
    return NpstreamStreamReader(parse_read_options(options, "stream", env={}))


def test_reader_with_token_and_root_certificates_reads(secure_broker):
    broker, cert = secure_broker
    stream_reader = reader({"broker": broker.address, "stream": "s", "token": TOKEN,
                            "tlsrootcertificates": str(cert), "startingoffsets": "earliest"})
    try:
        assert stream_reader.initialOffset() == {"s": 0}
        batches = list(stream_reader.read(RangePartition("s", 0, 2)))
        assert [v for b in batches for v in b.column("value").to_pylist()] == [b"a", b"b"]
    finally:
        stream_reader.stop()


def test_reader_with_wrong_token_fails_unauthenticated(secure_broker):
    broker, cert = secure_broker
    stream_reader = reader({"broker": broker.address, "stream": "s", "token": "wrong",
                            "tlsrootcertificates": str(cert)})
    try:
        with pytest.raises(Unauthenticated):
            stream_reader.initialOffset()
    finally:
        stream_reader.stop()

"""Connection options (token, tls*, mutual TLS) of the reader against real brokers."""

from __future__ import annotations

import pytest

from npstream import Client, Unauthenticated
from npstream.spark.options import InvalidOptionError, parse_connection_options, parse_read_options
from npstream.spark.range_reader import RangePartition
from npstream.spark.stream_reader import NpstreamStreamReader

TOKEN = "reader-token"


@pytest.fixture
def secure_broker(broker_factory, tls_files):
    broker = broker_factory("secure", env={"NPSTREAM_AUTH_TOKEN": TOKEN, **tls_files.broker_env})
    with Client(broker.address, TOKEN, root_certificates=tls_files.ca.read_bytes(),
                client_cert=tls_files.client_cert.read_bytes(),
                client_key=tls_files.client_key.read_bytes()) as client:
        client.publish_batch("s", [{"value": b"a"}, {"value": b"b"}])
    return broker, tls_files


def mtls_options(files) -> dict[str, str]:
    return {"tlsrootcertificates": str(files.ca), "tlsclientcertificate": str(files.client_cert),
            "tlsclientkey": str(files.client_key)}


def reader(options: dict[str, str]) -> NpstreamStreamReader:
    return NpstreamStreamReader(parse_read_options(options, "stream", env={}))


def test_reader_with_token_and_client_certificate_reads(secure_broker):
    broker, files = secure_broker
    stream_reader = reader({"broker": broker.address, "stream": "s", "token": TOKEN,
                            **mtls_options(files), "startingoffsets": "earliest"})
    try:
        assert stream_reader.initialOffset() == {"s": 0}
        batches = list(stream_reader.read(RangePartition("s", 0, 2)))
        assert [v for b in batches for v in b.column("value").to_pylist()] == [b"a", b"b"]
    finally:
        stream_reader.stop()


def test_reader_with_wrong_token_fails_unauthenticated(secure_broker):
    broker, files = secure_broker
    stream_reader = reader({"broker": broker.address, "stream": "s", "token": "wrong",
                            **mtls_options(files)})
    try:
        with pytest.raises(Unauthenticated):
            stream_reader.initialOffset()
    finally:
        stream_reader.stop()


def test_client_certificate_options_are_read_checked_and_imply_tls(tls_files):
    options = parse_connection_options({"broker": "h:1", **mtls_options(tls_files)}, env={})
    assert options.tls
    assert options.client_cert == tls_files.client_cert.read_bytes()
    assert options.client_key == tls_files.client_key.read_bytes()
    assert b"PRIVATE KEY" not in repr(options).encode()  # the key stays out of logs
    with pytest.raises(InvalidOptionError, match="needs option 'tlsClientKey' too"):
        parse_connection_options({"tlsClientCertificate": str(tls_files.client_cert)}, env={})
    with pytest.raises(InvalidOptionError, match="needs option 'tlsClientCertificate' too"):
        parse_connection_options({"tlsClientKey": str(tls_files.client_key)}, env={})
    with pytest.raises(InvalidOptionError, match=r"'tlsClientCertificate'.* needs TLS"):
        parse_connection_options({"tls": "false", "tlsClientCertificate": str(
            tls_files.client_cert), "tlsClientKey": str(tls_files.client_key)}, env={})
    with pytest.raises(InvalidOptionError, match=r"Invalid value .* 'tlsClientKey'.*"
                                                 r"no PEM private key"):
        parse_connection_options({"tlsClientCertificate": str(tls_files.client_cert),
                                  "tlsClientKey": str(tls_files.client_cert)}, env={})


def test_the_writer_takes_the_same_client_certificate_options(tls_files):
    from pyspark.sql.types import StringType, StructField, StructType

    from npstream.spark.writer_options import parse_write_options

    schema = StructType([StructField("value", StringType())])
    options = parse_write_options({"stream": "t", "broker": "h:1", **mtls_options(tls_files)},
                                  schema, "batch", batch_sink_id="b", env={})
    assert options.connection.tls
    assert options.connection.client_cert == tls_files.client_cert.read_bytes()
    assert options.connection.client_key == tls_files.client_key.read_bytes()

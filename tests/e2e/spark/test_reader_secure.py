"""A Spark read through mutual TLS with a token that may read only some streams.

The connection options carry the CA, the client certificate and key, and the
token; ``streamPattern`` lists streams through the broker, which returns only
those the token may read, so the query reads exactly those.
"""

from __future__ import annotations

import pytest

from harness import write_tokens_file
from npstream import Client

pytestmark = pytest.mark.spark

ADMIN, READER = "spark-admin-7c1f", "spark-reader-2b9e"


def test_spark_reads_over_mutual_tls_only_the_streams_its_token_may_read(spark, broker_factory,
                                                                          tls_files, tmp_path):
    from npstream.spark import register

    broker = broker_factory("secure", env=tls_files.broker_env, args=write_tokens_file(
        tmp_path / "tokens.toml", ADMIN, READER, "sec-*"))
    with Client(broker.address, ADMIN, root_certificates=tls_files.ca.read_bytes(),
                client_cert=tls_files.client_cert.read_bytes(),
                client_key=tls_files.client_key.read_bytes()) as admin:
        admin.publish_batch("sec-a", [{"value": b"a1"}, {"value": b"a2"}])
        admin.publish_batch("sec-b", [{"value": b"b1"}])
        admin.publish_batch("secret", [{"value": b"hidden"}])  # matches the pattern, not "sec-*"
    register(spark)
    frame = (spark.read.format("npstream")
             .option("broker", broker.address)
             .option("token", READER)
             .option("tlsRootCertificates", str(tls_files.ca))
             .option("tlsClientCertificate", str(tls_files.client_cert))
             .option("tlsClientKey", str(tls_files.client_key))
             .option("streamPattern", "sec*")
             .load())
    rows = sorted((r.stream, r.value) for r in frame.select("stream", "value").collect())
    assert rows == [("sec-a", b"a1"), ("sec-a", b"a2"), ("sec-b", b"b1")]

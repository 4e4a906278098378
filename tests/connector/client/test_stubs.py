"""The SDK names each call's method by the generated stub's attribute, its name from the proto."""

from __future__ import annotations

import logging

import grpc
import pytest

from npstream.client.connection import Connection
from npstream.client.stubs import SERVICES, Stubs
from npstream.errors import BrokerUnavailable, InvalidArgument
from npstream.proto import pb


def test_every_method_of_the_proto_is_a_stub_attribute_named_as_in_the_proto():
    channel = grpc.insecure_channel("127.0.0.1:1")
    try:
        stubs = Stubs(channel)
        methods = [(service.name, method.name)
                   for service in pb.DESCRIPTOR.services_by_name.values()
                   for method in service.methods]
        assert len(methods) > 30 and {service for service, _ in methods} == set(SERVICES)
        for service, name in methods:
            target, found = stubs.method(lambda s, service=service, name=name:
                                         getattr(getattr(s, service), name))
            assert found == f"{service}.{name}"
            assert stubs.method(f"{service}.{name}") == (target, found)  # the name still works
        with pytest.raises(InvalidArgument, match=r"unknown rpc 'StreamService\.Nope'; use "
                                                  r"'Service\.Method' with a service from "
                                                  r"\['ClusterService', 'GroupService'"):
            stubs.method("StreamService.Nope")
    finally:
        channel.close()


@pytest.mark.parametrize(("send", "method"), [
    (lambda conn: conn.call(lambda s: s.StreamService.DescribeStream,
                            pb.DescribeStreamRequest(name="orders")),
     "StreamService.DescribeStream"),
    (lambda conn: conn.call_serialized(lambda s: s.StreamService.PublishMany, b"",
                                       pb.PublishManyResponse),
     "StreamService.PublishMany"),
], ids=["typed", "raw-bytes"])
def test_a_retried_call_names_its_method_in_the_log(caplog, send, method):
    conn = Connection("127.0.0.1:1", retry_deadline=0.5)
    try:
        with caplog.at_level(logging.DEBUG, logger="npstream.client.connection"), \
                pytest.raises(BrokerUnavailable, match=r"gave up after \d+ attempt"):
            send(conn)
    finally:
        conn.close()
    assert any(f"({method}, attempt" in record.getMessage() for record in caplog.records)

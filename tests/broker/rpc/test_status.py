"""broker/rpc/status.py on a real in-process gRPC server: status codes, metadata, one ERROR
line."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from npstream.broker.auth.access import AccessControl
from npstream.broker.errors import GroupNotFoundError, OffsetOutOfRangeError
from npstream.broker.rpc.status import AuthInterceptor, observe_errors, rpc_method
from npstream.proto import pb, pb_grpc


class Streams(pb_grpc.StreamServiceServicer):
    @rpc_method
    def DescribeStream(self, request, context):
        raise RuntimeError("boom")

    @rpc_method
    def Fetch(self, request, context):
        raise OffsetOutOfRangeError(request.stream, request.offset, 3, 9)


class Groups(pb_grpc.GroupServiceServicer):
    @rpc_method
    def Subscribe(self, request_iterator, context) -> Iterator[pb.Delivery]:
        first = next(request_iterator)
        yield pb.Delivery(offset=1)
        raise GroupNotFoundError(first.open.stream, first.open.group)


@pytest.fixture
def server_address() -> Iterator[str]:
    interceptor = AuthInterceptor(AccessControl("t0ken").authenticated)
    server = grpc.server(ThreadPoolExecutor(4), interceptors=[interceptor])
    pb_grpc.add_StreamServiceServicer_to_server(Streams(), server)
    pb_grpc.add_GroupServiceServicer_to_server(Groups(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


AUTH = (("authorization", "Bearer t0ken"),)


def test_unexpected_exception_is_internal_with_one_error_log_line(server_address, caplog):
    seen: list[str] = []
    observe_errors(seen.append)
    try:
        with grpc.insecure_channel(server_address) as channel, caplog.at_level(logging.ERROR):
            stub = pb_grpc.StreamServiceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.DescribeStream(pb.DescribeStreamRequest(name="s"), metadata=AUTH)
    finally:
        observe_errors(None)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == "internal broker error in DescribeStream: RuntimeError: boom"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert seen == ["INTERNAL"]


def test_out_of_range_carries_offsets_as_trailing_metadata(server_address):
    with grpc.insecure_channel(server_address) as channel:
        stub = pb_grpc.StreamServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Fetch(pb.FetchRequest(stream="s", offset=12), metadata=AUTH)
    assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
    meta = dict(info.value.trailing_metadata())
    assert (meta["x-npstream-stream"], meta["x-npstream-offset"],
            meta["x-npstream-start-offset"], meta["x-npstream-end-offset"]) == (
        "s", "12", "3", "9")


def test_streaming_method_error_after_a_delivery_keeps_its_code(server_address):
    with grpc.insecure_channel(server_address) as channel:
        stub = pb_grpc.GroupServiceStub(channel)
        request = pb.SubscribeRequest(open=pb.SubscribeRequest.Open(stream="s", group="g"))
        call = stub.Subscribe(iter([request]), metadata=AUTH)
        assert next(call).offset == 1
        with pytest.raises(grpc.RpcError) as info:
            next(call)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "group 'g' does not exist on stream 's'"


def test_streaming_method_without_token_is_unauthenticated(server_address):
    with grpc.insecure_channel(server_address) as channel:
        stub = pb_grpc.GroupServiceStub(channel)
        call = stub.Subscribe(iter([pb.SubscribeRequest()]))
        with pytest.raises(grpc.RpcError) as info:
            next(call)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

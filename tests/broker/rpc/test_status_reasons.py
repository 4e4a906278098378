"""Every broker error carries its ErrorReason: the classes declare one, the wire sends it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

import npstream.broker as broker_package
import npstream.broker.errors as broker_errors
from npstream.broker.auth.access import AccessControl
from npstream.broker.errors import (
    BrokerError,
    GroupNotFoundError,
    OffsetOutOfRangeError,
    StreamNotFoundError,
)
from npstream.broker.rpc.status import AuthInterceptor, rpc_method
from npstream.proto import metadata_keys, pb, pb_grpc

AUTH = ((metadata_keys.AUTHORIZATION, "Bearer t0ken"),)


def _broker_error_classes() -> list[type[BrokerError]]:
    """Every BrokerError subclass the broker defines (its errors module, and any other).

    Every broker module is imported first, so what is found does not depend on
    which other tests ran before (MOVE_FAILED's class lives in cluster/move.py).
    """
    for module_info in pkgutil.walk_packages(broker_package.__path__, "npstream.broker."):
        if not module_info.name.endswith("__main__"):
            importlib.import_module(module_info.name)
    found: set[type[BrokerError]] = set()
    for _, obj in inspect.getmembers(broker_errors, inspect.isclass):
        if issubclass(obj, BrokerError) and obj is not BrokerError:
            found.add(obj)
    # Subclasses defined anywhere else in the broker count too.
    pending = list(BrokerError.__subclasses__())
    while pending:
        cls = pending.pop()
        if cls.__module__.startswith("npstream.broker"):
            found.add(cls)
        pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: c.__qualname__)


@pytest.mark.parametrize("cls", _broker_error_classes(), ids=lambda c: c.__name__)
def test_every_broker_error_has_a_reason(cls: type[BrokerError]) -> None:
    assert cls.reason != pb.ERROR_REASON_UNSPECIFIED
    assert cls.reason in pb.ErrorReason.values()


def test_the_sink_errors_are_among_the_checked_classes() -> None:
    names = {c.__name__ for c in _broker_error_classes()}
    assert {"SinkConflictError", "StagingNotFoundError", "StreamNeedsRepairError",
            "MoveFailedError", "DeadLetterElsewhereError"} <= names


def test_every_reason_is_sent_by_some_broker_path() -> None:
    """A reason no broker path sends is dead contract (auth and bugs are sent by status.py)."""
    sent = {c.reason for c in _broker_error_classes()}
    sent |= {pb.ERROR_REASON_UNAUTHENTICATED, pb.ERROR_REASON_INTERNAL}
    unused = set(pb.ErrorReason.values()) - sent - {pb.ERROR_REASON_UNSPECIFIED}
    assert not unused, [pb.ErrorReason.Name(r) for r in unused]


class Streams(pb_grpc.StreamServiceServicer):
    @rpc_method
    def DescribeStream(self, request, context):
        if request.name == "boom":
            raise RuntimeError("boom")
        raise StreamNotFoundError(request.name)

    @rpc_method
    def Fetch(self, request, context):
        raise OffsetOutOfRangeError(request.stream, request.offset, 3, 9)


class Groups(pb_grpc.GroupServiceServicer):
    @rpc_method
    def DescribeGroup(self, request, context):
        raise GroupNotFoundError(request.stream, request.group)

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


def _reason(err: grpc.RpcError) -> str | None:
    return dict(err.trailing_metadata() or ()).get(metadata_keys.REASON)


def test_not_found_errors_name_stream_or_group_in_the_reason(server_address: str) -> None:
    with grpc.insecure_channel(server_address) as channel:
        with pytest.raises(grpc.RpcError) as stream_err:
            pb_grpc.StreamServiceStub(channel).DescribeStream(
                pb.DescribeStreamRequest(name="s"), metadata=AUTH)
        with pytest.raises(grpc.RpcError) as group_err:
            pb_grpc.GroupServiceStub(channel).DescribeGroup(
                pb.DescribeGroupRequest(stream="s", group="g"), metadata=AUTH)
    assert stream_err.value.code() == group_err.value.code() == grpc.StatusCode.NOT_FOUND
    assert _reason(stream_err.value) == "ERROR_REASON_STREAM_NOT_FOUND"
    assert _reason(group_err.value) == "ERROR_REASON_GROUP_NOT_FOUND"


def test_out_of_range_sends_reason_beside_the_offsets(server_address: str) -> None:
    with grpc.insecure_channel(server_address) as channel, pytest.raises(grpc.RpcError) as err:
        pb_grpc.StreamServiceStub(channel).Fetch(pb.FetchRequest(stream="s", offset=12),
                                                 metadata=AUTH)
    meta = dict(err.value.trailing_metadata())
    assert meta[metadata_keys.REASON] == "ERROR_REASON_OFFSET_OUT_OF_RANGE"
    assert meta[metadata_keys.START_OFFSET] == "3"


def test_unexpected_exception_sends_reason_internal(server_address: str) -> None:
    with grpc.insecure_channel(server_address) as channel, pytest.raises(grpc.RpcError) as err:
        pb_grpc.StreamServiceStub(channel).DescribeStream(
            pb.DescribeStreamRequest(name="boom"), metadata=AUTH)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert _reason(err.value) == "ERROR_REASON_INTERNAL"


def test_streaming_error_after_a_delivery_sends_its_reason(server_address: str) -> None:
    with grpc.insecure_channel(server_address) as channel:
        request = pb.SubscribeRequest(open=pb.SubscribeRequest.Open(stream="s", group="g"))
        call = pb_grpc.GroupServiceStub(channel).Subscribe(iter([request]), metadata=AUTH)
        assert next(call).offset == 1
        with pytest.raises(grpc.RpcError) as err:
            next(call)
    assert _reason(err.value) == "ERROR_REASON_GROUP_NOT_FOUND"


@pytest.mark.parametrize("metadata", [(), ((metadata_keys.AUTHORIZATION, "Bearer wrong"),)],
                         ids=["no-token", "wrong-token"])
def test_auth_rejection_sends_reason_unauthenticated(
        server_address: str, metadata: tuple[tuple[str, str], ...]) -> None:
    with grpc.insecure_channel(server_address) as channel:
        with pytest.raises(grpc.RpcError) as unary:
            pb_grpc.StreamServiceStub(channel).DescribeStream(
                pb.DescribeStreamRequest(name="s"), metadata=metadata)
        call = pb_grpc.GroupServiceStub(channel).Subscribe(iter([pb.SubscribeRequest()]),
                                                           metadata=metadata)
        with pytest.raises(grpc.RpcError) as streaming:
            next(call)
    for err in (unary.value, streaming.value):
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED
        assert _reason(err) == "ERROR_REASON_UNAUTHENTICATED"

"""The client picks exception classes by the broker's ErrorReason, never by message text.

Unit tests of the mapping with hand-made RpcErrors, then the same against a
real broker process (the ``broker``/``client`` fixtures of tests/conftest.py).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pyarrow as pa
import pytest

import npstream
from npstream.errors import (
    CODE_CLASSES,
    REASON_CLASSES,
    AlreadyExists,
    BrokerUnavailable,
    GroupNotFound,
    InvalidArgument,
    MessageTooLarge,
    NotOwner,
    NpstreamError,
    OffsetOutOfRange,
    SinkConflict,
    StagingNotFound,
    StreamNeedsRepair,
    StreamNotFound,
    from_rpc_error,
)
from npstream.proto import metadata_keys, pb, pb_grpc
from npstream.proto.error_reasons import SPECS

REASONS = [r for r in pb.ErrorReason.values() if r != pb.ERROR_REASON_UNSPECIFIED]

# Text that would fool a text-reading classifier: it reads like another error.
MISLEADING = "stream 'group' does not exist; run `npstream streams repair` (group 'g')"


class FakeRpcError(grpc.RpcError):
    """What a gRPC call raises: code, details and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: str,
                 trailing: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(details)
        self._code = code
        self._details = details
        self._trailing = trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing


def _with_reason(reason: int) -> tuple[tuple[str, str], ...]:
    return ((metadata_keys.REASON, pb.ErrorReason.Name(reason)),)


# ---------------------------------------------------------------- the mapping


@pytest.mark.parametrize("reason", REASONS, ids=pb.ErrorReason.Name)
def test_reason_decides_the_class_whatever_the_text(reason: int) -> None:
    cls = REASON_CLASSES[reason]
    assert cls.__name__ == SPECS[reason].client_class
    code = cls.code or grpc.StatusCode.UNKNOWN
    err = from_rpc_error(FakeRpcError(code, MISLEADING, _with_reason(reason)), "h:1")
    assert type(err) is cls
    assert err.reason == reason
    assert err.code == code
    assert MISLEADING in str(err)


def test_same_code_different_reasons_give_different_classes() -> None:
    def convert(code: grpc.StatusCode, reason: int) -> NpstreamError:
        return from_rpc_error(FakeRpcError(code, MISLEADING, _with_reason(reason)), "h:1")

    not_found = grpc.StatusCode.NOT_FOUND
    assert type(convert(not_found, pb.ERROR_REASON_GROUP_NOT_FOUND)) is GroupNotFound
    assert type(convert(not_found, pb.ERROR_REASON_STREAM_NOT_FOUND)) is StreamNotFound
    precondition = grpc.StatusCode.FAILED_PRECONDITION
    assert type(convert(precondition, pb.ERROR_REASON_STREAM_NEEDS_REPAIR)) is StreamNeedsRepair
    assert type(convert(precondition, pb.ERROR_REASON_SINK_CONFLICT)) is SinkConflict
    assert type(convert(precondition, pb.ERROR_REASON_STAGING_NOT_FOUND)) is StagingNotFound


@pytest.mark.parametrize(("code", "cls"), list(CODE_CLASSES.items()),
                         ids=lambda v: getattr(v, "name", getattr(v, "__name__", str(v))))
def test_without_a_reason_the_status_code_decides(code: grpc.StatusCode,
                                                  cls: type[NpstreamError]) -> None:
    err = from_rpc_error(FakeRpcError(code, "group 'g' does not exist"), "h:1")
    assert type(err) is cls
    assert err.reason is None
    assert err.code == code


def test_unknown_or_unspecified_reason_falls_back_to_the_code() -> None:
    for name in ("ERROR_REASON_FROM_THE_FUTURE", "ERROR_REASON_UNSPECIFIED", ""):
        err = from_rpc_error(FakeRpcError(grpc.StatusCode.NOT_FOUND, "x",
                                          ((metadata_keys.REASON, name),)), "h:1")
        assert type(err) is StreamNotFound and err.reason is None


def test_codes_without_a_class_stay_plain_npstream_errors_with_their_code() -> None:
    for code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.RESOURCE_EXHAUSTED,
                 grpc.StatusCode.UNIMPLEMENTED):
        err = from_rpc_error(FakeRpcError(code, "x"), "h:1")
        assert type(err) is NpstreamError and err.code == code and err.reason is None


def test_out_of_range_keeps_its_offsets_and_reason() -> None:
    trailing = (*_with_reason(pb.ERROR_REASON_OFFSET_OUT_OF_RANGE),
                (metadata_keys.STREAM, "s"), (metadata_keys.OFFSET, "12"),
                (metadata_keys.START_OFFSET, "3"), (metadata_keys.END_OFFSET, "9"))
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.OUT_OF_RANGE, "x", trailing), "h:1")
    assert isinstance(err, OffsetOutOfRange)
    assert (err.stream, err.offset, err.start_offset, err.end_offset) == ("s", 12, 3, 9)
    assert err.reason == pb.ERROR_REASON_OFFSET_OUT_OF_RANGE


def test_not_owner_carries_the_owner_and_stream_of_the_redirect() -> None:
    trailing = (*_with_reason(pb.ERROR_REASON_NOT_OWNER), (metadata_keys.STREAM, "s"),
                (metadata_keys.OWNER, "10.0.0.2:7070"))
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "x", trailing), "h:1")
    assert isinstance(err, NotOwner) and isinstance(err, BrokerUnavailable)
    assert (err.stream, err.owner, str(err)) == ("s", "10.0.0.2:7070", "x")
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION


def test_shutting_down_is_broker_unavailable_naming_the_address() -> None:
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "stopping",
                                      _with_reason(pb.ERROR_REASON_SHUTTING_DOWN)), "h:1")
    assert isinstance(err, BrokerUnavailable) and isinstance(err, ConnectionError)
    assert str(err) == "broker at h:1 is unavailable: stopping"
    assert err.reason == pb.ERROR_REASON_SHUTTING_DOWN


@pytest.mark.parametrize("idempotent", [True, False])
def test_unavailable_after_retries_keeps_the_reason_and_code(idempotent: bool) -> None:
    """The BrokerUnavailable raised once retries end (or for an unsafe resend) keeps both."""
    from npstream.client.connection import Connection

    def send() -> None:
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE, "stopping",
                           _with_reason(pb.ERROR_REASON_SHUTTING_DOWN))

    connection = Connection("127.0.0.1:1", retry_deadline=0)
    try:
        with pytest.raises(BrokerUnavailable) as info:
            connection._retrying("StreamService.Publish", send, idempotent)
    finally:
        connection.close()
    assert str(info.value).startswith("broker at 127.0.0.1:1 is unavailable: stopping (")
    assert info.value.reason == pb.ERROR_REASON_SHUTTING_DOWN
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_sink_client_turns_a_reasonless_precondition_into_sink_conflict() -> None:
    """An older broker sends no reason; from a sink call that is a conflict, not a repair."""
    from npstream.sink.client import SinkClient

    def send() -> None:
        raise from_rpc_error(FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION,
                                          "run `npstream streams repair s`"), "h:1")

    with pytest.raises(SinkConflict):
        SinkClient._converted(send)

    def send_repair() -> None:
        raise from_rpc_error(FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "x",
                                          _with_reason(pb.ERROR_REASON_STREAM_NEEDS_REPAIR)),
                             "h:1")

    with pytest.raises(StreamNeedsRepair):
        SinkClient._converted(send_repair)


def test_sink_conflict_is_one_class_for_both_import_paths() -> None:
    from npstream.sink import client as sink_client

    assert sink_client.SinkConflict is SinkConflict
    assert issubclass(StagingNotFound, SinkConflict)
    assert issubclass(MessageTooLarge, InvalidArgument)


# ---------------------------------------------------------------- the hierarchy


def _connector_modules() -> Iterator[str]:
    """Every module of the npstream (connector/) package, without broker/ or proto/."""
    for info in pkgutil.walk_packages(npstream.__path__, "npstream."):
        name = info.name
        if name.startswith(("npstream.broker", "npstream.proto")) or name.endswith("__main__"):
            continue
        yield name


def _connector_exception_classes() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for name in _connector_modules():
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == name and issubclass(obj, BaseException):
                found.append(obj)
    return found


def test_every_exception_class_of_the_package_derives_from_npstream_error() -> None:
    classes = _connector_exception_classes()
    names = {c.__name__ for c in classes}
    # Those that used to sit outside NpstreamError are found (the walk works).
    assert {"InvalidOptionError", "DataLossError", "CliError", "LocalReadUnavailable",
            "InboxUnavailable", "SinkConflict"} <= names
    outside = [f"{c.__module__}.{c.__qualname__}" for c in classes
               if not issubclass(c, NpstreamError)]
    assert outside == []


def test_every_exception_class_of_the_package_lives_in_an_errors_module() -> None:
    """npstream.errors for the SDK, npstream.cli.errors and npstream.spark.errors for theirs."""
    homes = {c.__module__ for c in _connector_exception_classes()}
    assert homes == {"npstream.errors", "npstream.cli.errors", "npstream.spark.errors"}


def test_exception_classes_keep_their_old_import_paths() -> None:
    from npstream.cli.common import CliError
    from npstream.spark.data_loss import DataLossError
    from npstream.spark.options import InvalidOptionError
    from npstream.spark.writer import NoMicroBatchError

    assert CliError.__module__ == "npstream.cli.errors"
    assert {DataLossError.__module__, InvalidOptionError.__module__,
            NoMicroBatchError.__module__} == {"npstream.spark.errors"}


def test_every_error_class_of_npstream_errors_is_exported_from_npstream() -> None:
    import npstream.errors as errors

    classes = [name for name in errors.__all__
               if isinstance(getattr(errors, name), type)
               and issubclass(getattr(errors, name), BaseException)]
    assert "MessageTooLarge" in classes  # the walk works
    assert [name for name in classes if name not in npstream.__all__] == []
    assert all(getattr(npstream, name) is getattr(errors, name) for name in classes)


def test_exceptions_keep_the_builtin_bases_users_catch() -> None:
    from npstream.spark.data_loss import DataLossError
    from npstream.spark.options import InvalidOptionError

    expected: list[tuple[type[BaseException], type[BaseException]]] = [
        (InvalidOptionError, ValueError),
        (DataLossError, RuntimeError),
        (InvalidArgument, ValueError),
        (MessageTooLarge, ValueError),
        (StreamNotFound, LookupError),
        (GroupNotFound, LookupError),
        (OffsetOutOfRange, IndexError),
        (BrokerUnavailable, ConnectionError),
    ]
    for cls, base in expected:
        assert issubclass(cls, base) and issubclass(cls, NpstreamError), cls


# ---------------------------------------------------------------- a real broker


def test_missing_group_and_missing_stream_raise_their_own_class_with_reason(
        client: Any, stream_name: str) -> None:
    client.create_stream(stream_name)
    with pytest.raises(GroupNotFound) as group_err:
        client.describe_group(stream_name, "nope")
    with pytest.raises(StreamNotFound) as stream_err:
        client.stream_info(f"{stream_name}-missing")
    assert not isinstance(group_err.value, StreamNotFound)
    assert not isinstance(stream_err.value, GroupNotFound)
    assert group_err.value.reason == pb.ERROR_REASON_GROUP_NOT_FOUND
    assert stream_err.value.reason == pb.ERROR_REASON_STREAM_NOT_FOUND
    assert group_err.value.code == stream_err.value.code == grpc.StatusCode.NOT_FOUND


class _Retexted(grpc.RpcError):
    """A real broker's RpcError with other details text: only the text changes."""

    def __init__(self, real: grpc.RpcError, details: str) -> None:
        super().__init__(details)
        self._real = real
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._real.code()

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._real.trailing_metadata()


def _rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def test_real_broker_errors_are_classified_by_reason_even_with_swapped_text(
        broker: Any, client: Any, stream_name: str) -> None:
    client.create_stream(stream_name)
    with grpc.insecure_channel(broker.address) as channel:
        group_rpc = _rpc_error(lambda: pb_grpc.GroupServiceStub(channel).DescribeGroup(
            pb.DescribeGroupRequest(stream=stream_name, group="nope"), timeout=10))
        stream_rpc = _rpc_error(lambda: pb_grpc.StreamServiceStub(channel).DescribeStream(
            pb.DescribeStreamRequest(name=f"{stream_name}-missing"), timeout=10))
    assert group_rpc.code() == stream_rpc.code() == grpc.StatusCode.NOT_FOUND
    group_text, stream_text = group_rpc.details() or "", stream_rpc.details() or ""
    assert group_text != stream_text
    group = from_rpc_error(_Retexted(group_rpc, stream_text), broker.address)
    stream = from_rpc_error(_Retexted(stream_rpc, group_text), broker.address)
    assert type(group) is GroupNotFound and group.reason == pb.ERROR_REASON_GROUP_NOT_FOUND
    assert type(stream) is StreamNotFound and stream.reason == pb.ERROR_REASON_STREAM_NOT_FOUND
    assert str(group) == stream_text and str(stream) == group_text


def test_real_broker_commit_of_unknown_staging_is_staging_not_found(
        client: Any, stream_name: str) -> None:
    sink = client.sink(local_staging=False)
    with pytest.raises(StagingNotFound) as err:
        sink.commit(f"{stream_name}-sink", 0, ["never-staged"])
    assert isinstance(err.value, SinkConflict)
    assert err.value.reason == pb.ERROR_REASON_STAGING_NOT_FOUND
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_real_broker_other_reasons_reach_the_client(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, max_message_bytes=100)
    with pytest.raises(AlreadyExists) as exists:
        client.create_stream(stream_name, max_message_bytes=200)
    assert exists.value.reason == pb.ERROR_REASON_ALREADY_EXISTS
    with pytest.raises(InvalidArgument) as too_big:
        client.publish_batch(stream_name, pa.table({"value": [b"x" * 101]}))
    assert type(too_big.value) is MessageTooLarge
    assert too_big.value.reason == pb.ERROR_REASON_MESSAGE_TOO_LARGE
    with pytest.raises(OffsetOutOfRange) as out_of_range:
        client.delete_messages(stream_name, before_offset=5)
    assert out_of_range.value.reason == pb.ERROR_REASON_OFFSET_OUT_OF_RANGE

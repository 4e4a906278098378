"""One class per reason on each side, both made from the reason's (error) option.

The broker side: exactly one BrokerError class declares each reason; another
error of the same reason is a subclass of it. Each broker error is reported
with the status and trailing keys its reason declares, and the client turns
that report into the reason's one class, with the values of its attributes:
in process (error_status, from_status), then through a gRPC server on loopback.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

import npstream.broker as broker_package
from npstream.broker import errors as be
from npstream.broker.rpc.status import error_status, rpc_method
from npstream.errors import REASON_CLASSES, NpstreamError, from_rpc_error, from_status
from npstream.proto import metadata_keys, pb, pb_grpc
from npstream.proto.error_reasons import SPECS, attribute_of

_CORRUPT = be.CorruptRecordError("/d/s/0.log", 64, "bad crc")

# One instance of every broker error class, as the broker raises it.
SAMPLES: dict[str, Callable[[], be.BrokerError]] = {
    "BrokerError": lambda: be.BrokerError("boom"),
    "InvalidArgumentError": lambda: be.InvalidArgumentError("bad name"),
    "StreamNotFoundError": lambda: be.StreamNotFoundError("s"),
    "GroupNotFoundError": lambda: be.GroupNotFoundError("s", "g"),
    "SchemaInvalidError": lambda: be.SchemaInvalidError("bad schema"),
    "SchemaIncompatibleError": lambda: be.SchemaIncompatibleError("narrowed"),
    "ValueMismatchError": lambda: be.ValueMismatchError("not an int"),
    "AlreadyExistsError": lambda: be.AlreadyExistsError("exists"),
    "OffsetOutOfRangeError": lambda: be.OffsetOutOfRangeError("s", 12, 3, 9),
    "MessageTooLargeError": lambda: be.MessageTooLargeError("s", 0, 10, 5),
    "CorruptRecordError": lambda: _CORRUPT,
    "StreamNeedsRepairError": lambda: be.StreamNeedsRepairError("s", _CORRUPT),
    "UnauthenticatedError": lambda: be.UnauthenticatedError("who"),
    "PermissionDeniedError": lambda: be.PermissionDeniedError("s", "read", "app"),
    "ShuttingDownError": lambda: be.ShuttingDownError("stopping"),
    "NotOwnerError": lambda: be.NotOwnerError("s", "10.0.0.2:7070", True),
    "DeadLetterElsewhereError": lambda: be.DeadLetterElsewhereError(
        "dl", "10.0.0.2:7070", "10.0.0.1:7070"),
    "StreamMovingError": lambda: be.StreamMovingError("s", "10.0.0.2:7070", 300),
    "MemberUnavailableError": lambda: be.MemberUnavailableError("m2", "no owner", "down"),
    "SinkConflictError": lambda: be.SinkConflictError("batch 3 unfinished"),
    "StagingNotFoundError": lambda: be.StagingNotFoundError("never staged"),
    "StagingFormatError": lambda: be.StagingFormatError("/d/x.stage", 1, 2),
    "DiskFullError": lambda: be.DiskFullError("s", "publish", "ENOSPC"),
    "DiskIOError": lambda: be.DiskIOError("s", "fsync", "EIO"),
    "OverloadedError": lambda: be.OverloadedError("budget used up", 250),
    "MoveFailedError": lambda: be.MoveFailedError("target refused"),
}


def _broker_classes() -> list[type[be.BrokerError]]:
    """BrokerError and every subclass the broker defines (all its modules imported)."""
    for info in pkgutil.walk_packages(broker_package.__path__, "npstream.broker."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    found, pending = [be.BrokerError], list(be.BrokerError.__subclasses__())
    while pending:
        cls = pending.pop()
        if cls.__module__.startswith("npstream.broker") and cls not in found:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: c.__name__)


def test_every_reason_has_exactly_one_declaring_class_on_each_side() -> None:
    classes = _broker_classes()
    for reason, spec in SPECS.items():
        declaring = [c for c in classes if vars(c).get("reason") == reason]
        assert len(declaring) == 1, (spec.name, declaring)
        others = [c for c in classes if c.reason == reason and c is not declaring[0]]
        assert all(issubclass(c, declaring[0]) for c in others), (spec.name, others)
        client = REASON_CLASSES[reason]
        assert client.__name__ == spec.client_class
        assert tuple(b.__name__ for b in client.__bases__) == spec.client_bases
        assert client.code == grpc.StatusCode[spec.status]
    assert set(REASON_CLASSES) == set(SPECS)


def test_every_broker_error_class_has_a_sample_here() -> None:
    """A new error class needs a line in SAMPLES, so the round trip below covers it."""
    assert sorted(c.__name__ for c in _broker_classes()) == sorted(SAMPLES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_broker_error_reaches_the_client_as_its_reasons_class(name: str) -> None:
    exc = SAMPLES[name]()
    assert type(exc).__name__ == name
    spec = SPECS[exc.reason]
    code, details, trailing = error_status(exc, "Call")
    assert code == grpc.StatusCode[spec.status]
    assert [key for key, _ in trailing] == [metadata_keys.REASON, *spec.trailing]
    error = from_status(code, details, dict(trailing), "h:1")
    assert type(error) is REASON_CLASSES[exc.reason]
    assert (error.reason, error.code) == (exc.reason, code)
    assert str(error).endswith(str(exc))


def test_trailing_values_become_the_client_errors_attributes() -> None:
    def through(exc: be.BrokerError) -> NpstreamError:
        code, details, trailing = error_status(exc, "Call")
        return from_status(code, details, dict(trailing), "h:1")

    out_of_range = through(SAMPLES["OffsetOutOfRangeError"]())
    assert (out_of_range.stream, out_of_range.offset, out_of_range.start_offset,  # type: ignore[attr-defined]
            out_of_range.end_offset) == ("s", 12, 3, 9)  # type: ignore[attr-defined]
    redirect = through(SAMPLES["DeadLetterElsewhereError"]())
    assert (redirect.stream, redirect.owner) == ("dl", "10.0.0.2:7070")  # type: ignore[attr-defined]
    moving = through(SAMPLES["StreamMovingError"]())
    assert (moving.stream, moving.retry_after) == ("s", 0.3)  # type: ignore[attr-defined]
    assert through(SAMPLES["OverloadedError"]()).retry_after == 0.25  # type: ignore[attr-defined]
    assert str(through(SAMPLES["ShuttingDownError"]())) == "broker at h:1 is unavailable: stopping"


class _Raising(pb_grpc.StreamServiceServicer):
    """DescribeStream raises the broker error SAMPLES names by the request's stream name."""

    @rpc_method
    def DescribeStream(self, request, context):
        raise SAMPLES[request.name]()


@pytest.fixture(scope="module")
def raising_address() -> Iterator[str]:
    server = grpc.server(ThreadPoolExecutor(2))
    pb_grpc.add_StreamServiceServicer_to_server(_Raising(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_broker_error_over_grpc_becomes_its_reasons_class(raising_address: str,
                                                         name: str) -> None:
    """The same through a real gRPC server: status, details and trailing metadata on the wire."""
    exc = SAMPLES[name]()
    with grpc.insecure_channel(raising_address) as channel, \
            pytest.raises(grpc.RpcError) as info:
        pb_grpc.StreamServiceStub(channel).DescribeStream(pb.DescribeStreamRequest(name=name),
                                                          timeout=10)
    error = from_rpc_error(info.value, raising_address)
    assert type(error) is REASON_CLASSES[exc.reason]
    assert error.reason == exc.reason
    assert error.code == grpc.StatusCode[SPECS[exc.reason].status]
    assert str(error).endswith(str(exc))
    for key in SPECS[exc.reason].trailing:
        if key != metadata_keys.RETRY_AFTER_MS:  # the client keeps it in seconds
            attribute = attribute_of(key)
            assert str(getattr(error, attribute)) == str(getattr(exc, attribute)), key


def test_a_class_unlike_its_declaration_fails_the_import(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import npstream.errors as errors

    class StreamNotFound(NpstreamError, KeyError):  # the proto declares LookupError
        pass

    monkeypatch.setattr(errors, "StreamNotFound", StreamNotFound)
    with pytest.raises(TypeError, match="StreamNotFound's bases"):
        errors._reason_classes()

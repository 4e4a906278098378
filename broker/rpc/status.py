"""Broker errors to gRPC statuses, in one place, and the auth interceptor.

Servicers raise typed ``BrokerError``s; ``rpc_method`` turns each into the
status code its ``reason`` (an ``npstream.v1.ErrorReason``) declares in the
proto (``STATUS_CODES``, from npstream.proto.error_reasons), with the error's
message as details and the reason as trailing metadata, so that clients tell
a missing group from a missing stream without reading text. The keys the
reason declares besides (OUT_OF_RANGE's offsets, a redirect's owner) come
from the error's ``trailing()``. Anything else is a bug: it is logged once at
ERROR with its traceback and reported as INTERNAL (reason INTERNAL), never
swallowed. The auth interceptor's UNAUTHENTICATED carries its reason too:
every error the broker itself reports has one. Which tokens are known, and
what each may do, is npstream.broker.auth's business: the interceptor only
asks it whether a call's ``authorization`` value is a known token.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import grpc

from npstream.broker.errors import BrokerError, DiskFullError, UnauthenticatedError, is_disk_full
from npstream.proto import metadata_keys, pb
from npstream.proto.error_reasons import SPECS

__all__ = [
    "STATUS_CODES",
    "AuthInterceptor",
    "abort_with",
    "error_status",
    "observe_errors",
    "reason_metadata",
    "rpc_method",
    "stream_of",
]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

# Method-name prefixes that never need the token: load balancers and
# orchestrators probe health without credentials.
AUTH_EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)

_error_observer: Callable[[str], None] | None = None

# The status code each reason travels with, as its (error) option declares.
STATUS_CODES: dict[pb.ErrorReason, grpc.StatusCode] = {
    reason: grpc.StatusCode[spec.status] for reason, spec in SPECS.items()}


def observe_errors(observer: Callable[[str], None] | None) -> None:
    """Call observer(status_name) for every failed RPC (the server counts them in metrics)."""
    global _error_observer
    _error_observer = observer


def reason_metadata(reason: pb.ErrorReason) -> tuple[str, str]:
    """The trailing-metadata entry that names ``reason`` (its enum name, as the proto says)."""
    return (metadata_keys.REASON, pb.ErrorReason.Name(reason))


def error_status(exc: BaseException, method: str = "", request: object = None,
                 ) -> tuple[grpc.StatusCode, str, list[tuple[str, str]]]:
    """The status code, details and trailing metadata that report ``exc`` (see abort_with).

    Also what one failed entry of a PublishMany carries (broker/streams/publish_many.py),
    so an entry's error reads exactly as the failed call of it alone would.
    A non-BrokerError is a bug: logged at ERROR with its traceback, INTERNAL.
    """
    trailing: list[tuple[str, str]]
    if not isinstance(exc, BrokerError) and is_disk_full(exc):
        exc = DiskFullError(stream_of(request), method or "the call", exc,
                            "the call did not complete")
    if isinstance(exc, BrokerError):
        code = STATUS_CODES[exc.reason]
        trailing = [reason_metadata(exc.reason), *exc.trailing()]
        details = str(exc)
        log.debug("%s failed with %s: %s", method, code.name, details)
    else:
        code = STATUS_CODES[pb.ERROR_REASON_INTERNAL]
        trailing = [reason_metadata(pb.ERROR_REASON_INTERNAL)]
        details = f"internal broker error in {method}: {type(exc).__name__}: {exc}"
        log.error("unexpected error in %s", method, exc_info=exc)
    return code, details, trailing


def abort_with(context: grpc.ServicerContext, exc: BaseException, method: str = "",
               request: object = None) -> NoReturn:
    """End the RPC with the status and reason for exc (INTERNAL, logged, for non-BrokerErrors).

    A full disk is no bug: an OSError (ENOSPC) or SQLite error that says so and
    that no module turned into a DiskFullError itself is sent as one, naming
    the ``request``'s stream when it has one.
    """
    code, details, trailing = error_status(exc, method, request)
    if _error_observer is not None:
        _error_observer(code.name)
    context.set_trailing_metadata(tuple(trailing))
    context.abort(code, details)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises


def stream_of(request: object) -> str:
    """The stream a request names (``stream``, ``name`` or ``open.stream``), "" for none."""
    for field in ("stream", "name"):
        value = getattr(request, field, None)
        if isinstance(value, str) and value:
            return value
    opening = getattr(request, "open", None)  # SubscribeRequest
    stream = getattr(opening, "stream", "")
    return stream if isinstance(stream, str) else ""


def _already_aborted(exc: BaseException, context: grpc.ServicerContext) -> bool:
    """True for the exception grpc raises from context.abort (must propagate untouched)."""
    # grpc >= 1.38 has ServicerContext.code(); grpc-stubs 1.53 does not declare it.
    return (type(exc) is Exception and not exc.args
            and context.code() is not None)  # type: ignore[attr-defined]


def _client_gone(exc: BaseException, context: grpc.ServicerContext, method: str) -> bool:
    """True for the RpcError a request iterator raises once its call ended (the client
    cancelled, went away or passed its deadline): nobody is left to answer, and it is
    no bug, so it is neither mapped nor logged as one."""
    if isinstance(exc, grpc.RpcError) and not context.is_active():
        log.debug("%s ended: the client cancelled or left", method)
        return True
    return False


def rpc_method(func: F) -> F:
    """Decorate a servicer method (unary or streaming response) with the error mapping.

    The wrappers take and return what ``func`` does, so each is returned as F
    (the ``type: ignore[return-value]``s below: the checker cannot see that).
    """
    name = func.__name__

    if inspect.isgeneratorfunction(func):

        @functools.wraps(func)
        def stream_wrapper(self: object, request: object,
                           context: grpc.ServicerContext) -> Iterator[object]:
            try:
                yield from func(self, request, context)
            except GeneratorExit:
                raise
            except Exception as exc:
                if _already_aborted(exc, context) or _client_gone(exc, context, name):
                    raise
                abort_with(context, exc, name, request)

        return stream_wrapper  # type: ignore[return-value]

    @functools.wraps(func)
    def unary_wrapper(self: object, request: object, context: grpc.ServicerContext) -> object:
        try:
            return func(self, request, context)
        except Exception as exc:
            if _already_aborted(exc, context) or _client_gone(exc, context, name):
                raise
            abort_with(context, exc, name, request)

    return unary_wrapper  # type: ignore[return-value]


class AuthInterceptor(grpc.ServerInterceptor):
    """Reject calls without ``authorization: Bearer <known token>`` with UNAUTHENTICATED.

    ``authenticated(value)`` gets the call's ``authorization`` metadata value
    (None when absent): npstream.broker.auth.access.AccessControl.authenticated.
    What a known token may do is decided later, by the servicer that knows
    the stream.
    """

    def __init__(self, authenticated: Callable[[str | bytes | None], bool]) -> None:
        self._authenticated = authenticated

    def _authorized(self, details: grpc.HandlerCallDetails) -> bool:
        for key, value in details.invocation_metadata or ():
            if key == metadata_keys.AUTHORIZATION:
                return self._authenticated(value)
        return self._authenticated(None)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method or ""
        handler = continuation(handler_call_details)
        if handler is None or method.startswith(AUTH_EXEMPT_PREFIXES):
            return handler
        if self._authorized(handler_call_details):
            return handler
        log.warning("rejected %s: missing or wrong auth token", method)
        denial = UnauthenticatedError(
            "missing or invalid auth token: send metadata 'authorization: Bearer <token>'")

        def deny(_request: object, context: grpc.ServicerContext) -> None:
            abort_with(context, denial, method)

        kinds = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }
        make = kinds[(handler.request_streaming, handler.response_streaming)]
        return make(
            deny,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

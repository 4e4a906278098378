"""The cluster package's own errors: a member's error answer passed on as it is, and etcd's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from npstream.broker.cluster.peers import PeerFailure

__all__ = ["EtcdError", "EtcdUnavailable", "MemberIdTaken", "PeerError"]


class EtcdError(Exception):
    """etcd refused a request (the gRPC error's details say why)."""


class EtcdUnavailable(EtcdError):
    """No etcd endpoint answered."""


class MemberIdTaken(EtcdError):
    """Another live broker is registered with this member id (a copied data dir)."""


class PeerError(Exception):
    """A member answered with an error: passed on to the caller with its status and metadata."""

    def __init__(self, failure: PeerFailure) -> None:
        super().__init__(failure.detail)
        self.failure = failure

    def abort(self, context: grpc.ServicerContext) -> None:
        error = self.failure.error
        assert error is not None
        trailing: Any = error.trailing_metadata() if hasattr(error, "trailing_metadata") else ()
        context.set_trailing_metadata(tuple((key, value) for key, value in trailing or ()))
        context.abort(error.code(), f"cluster member {self.failure.member}: {error.details()}")

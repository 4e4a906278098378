"""gRPC metadata keys both sides send or read: one spelling, defined once.

Metadata keys are lower-case ASCII (gRPC requires it). Trailing metadata on a
failed call carries numbers and reasons so that clients never parse message
text.
"""

from __future__ import annotations

__all__ = [
    "AUTHORIZATION",
    "CLUSTER_LOCAL",
    "END_OFFSET",
    "MEMBER_ID",
    "OFFSET",
    "OFFSET_KEYS",
    "OWNER",
    "REASON",
    "RETRY_AFTER_MS",
    "START_OFFSET",
    "STREAM",
]

# Request metadata: ``authorization: Bearer <token>`` when the broker has a token.
AUTHORIZATION = "authorization"
# Request metadata of shared-group calls: the consumer member the call is for.
MEMBER_ID = "x-npstream-member-id"

# Trailing metadata of every error the broker reports: the name of its
# npstream.v1.ErrorReason (e.g. "ERROR_REASON_GROUP_NOT_FOUND"), which tells a
# client what failed where the status code is ambiguous (NOT_FOUND: stream or
# group; FAILED_PRECONDITION: repair, sink conflict or missing staging).
REASON = "x-npstream-reason"

# Trailing metadata of OUT_OF_RANGE errors: the stream, the offset asked for
# and the stream's [start, end) at the time of the call, as decimal strings.
STREAM = "x-npstream-stream"
OFFSET = "x-npstream-offset"
START_OFFSET = "x-npstream-start-offset"
END_OFFSET = "x-npstream-end-offset"
OFFSET_KEYS = (STREAM, OFFSET, START_OFFSET, END_OFFSET)

# Trailing metadata of OVERLOADED errors (RESOURCE_EXHAUSTED): how long the
# client should wait before sending the request again, in milliseconds.
RETRY_AFTER_MS = "x-npstream-retry-after-ms"

# Trailing metadata of NOT_OWNER errors (a redirect): the advertised address
# (host:port) of the cluster member that holds the stream the call named;
# ``STREAM`` names the stream. The client sends the call there.
OWNER = "x-npstream-owner"
# Request metadata of calls one cluster member makes to another ("1"): answer
# from this member's own streams only (no redirect, no asking the others), so
# that a lookup or a fan-out never loops.
CLUSTER_LOCAL = "x-npstream-cluster-local"

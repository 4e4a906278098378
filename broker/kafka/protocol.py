"""Kafka request and response framing: the size prefix, the headers, the served APIs.

A frame is an int32 size then that many bytes. A request starts with the
request header (v1 for non-flexible API versions, v2 with tagged fields for
flexible ones); a response with the response header (v0, or v1 when
flexible), except that ApiVersions' response header is always v0, so a
client that does not yet know the broker's versions can read it (KIP-511).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from npstream.broker.kafka.codec import Message, MessageSchema, Reader, load_schema
from npstream.broker.kafka.errors import CodecError

__all__ = [
    "API_VERSIONS_KEY",
    "SERVED",
    "Api",
    "RequestFrame",
    "decode_request",
    "encode_response",
]

API_VERSIONS_KEY = 18


@dataclass(frozen=True)
class Api:
    """One served API: its schemas and the versions this broker answers."""

    key: int
    name: str
    min_version: int
    max_version: int

    @property
    def request(self) -> MessageSchema:
        return load_schema(f"{self.name}Request")

    @property
    def response(self) -> MessageSchema:
        return load_schema(f"{self.name}Response")

    def flexible(self, version: int) -> bool:
        return version in self.request.flexible


# The APIs of this slice and the versions served (docs/kafka.md lists them).
SERVED: dict[int, Api] = {api.key: api for api in (
    Api(0, "Produce", 3, 11),
    Api(1, "Fetch", 4, 17),
    Api(2, "ListOffsets", 1, 10),
    Api(3, "Metadata", 0, 12),
    Api(API_VERSIONS_KEY, "ApiVersions", 0, 4),
)}


@dataclass(frozen=True)
class RequestFrame:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Reader  # positioned after the header


def decode_request(frame: bytes | memoryview) -> RequestFrame:
    """The header of a request frame (without its size prefix); CodecError if unreadable."""
    reader = Reader(frame)
    api_key = reader.fixed("int16")
    api_version = reader.fixed("int16")
    api = SERVED.get(api_key)
    flexible = api is not None and api.min_version <= api_version <= api.max_version \
        and api.flexible(api_version)
    header = load_schema("RequestHeader")
    reader.pos = 0
    fields = header.decode(reader, 2 if flexible else 1)
    return RequestFrame(api_key, api_version, fields["CorrelationId"], fields["ClientId"],
                        reader)


def encode_response(api: Api, version: int, correlation_id: int, body: Message) -> bytes:
    """A whole response frame: size prefix, response header, body."""
    header_version = 1 if api.flexible(version) and api.key != API_VERSIONS_KEY else 0
    header = load_schema("ResponseHeader").encode({"CorrelationId": correlation_id},
                                                  header_version)
    payload = api.response.encode(body, version)
    size = len(header) + len(payload)
    return size.to_bytes(4, "big") + header + payload


def decode_body(api: Api, request: RequestFrame) -> dict[str, Any]:
    body = api.request.decode(request.body, request.api_version)
    if request.body.remaining():
        raise CodecError(f"{api.name} v{request.api_version}: "
                         f"{request.body.remaining()} bytes left after the request")
    return body

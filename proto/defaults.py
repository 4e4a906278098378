"""Defaults that the broker and its clients must agree on, defined once for both.

A request field left at 0 means "the broker's default" (npstream.proto), and
the SDK, the CLI and the Spark connector show those same defaults as their
own; when the two sides kept their own copies, a change on one side would
have silently made the documentation of the other wrong. Broker-only
defaults stay in its configuration table (npstream.broker.server.config), and
Spark option defaults in the option tables (npstream.spark.options).
"""

from __future__ import annotations

__all__ = [
    "BROKER_ADDRESS_ENV",
    "DEFAULT_BROKER_ADDRESS",
    "DEFAULT_BROKER_PORT",
    "DEFAULT_FETCH_BYTES",
    "DEFAULT_FETCH_MESSAGES",
    "DEFAULT_LIST_PAGE_SIZE",
    "GRPC_MAX_MESSAGE_BYTES",
    "MAX_LIST_PAGE_SIZE",
    "MAX_PUBLISH_MANY_BYTES",
    "MAX_PUBLISH_MANY_ENTRIES",
]

# Where clients look for a broker when no address is given, and where the
# broker listens by default.
BROKER_ADDRESS_ENV = "NPSTREAM_BROKER"
DEFAULT_BROKER_PORT = 7070
DEFAULT_BROKER_ADDRESS = f"localhost:{DEFAULT_BROKER_PORT}"

# FetchRequest.max_messages / max_bytes of 0 (and ReadRange's max_bytes).
# 8 MiB: one stored batch of the default max_batch_bytes fits in one reply.
DEFAULT_FETCH_MESSAGES = 10_000
DEFAULT_FETCH_BYTES = 8 << 20

# ListStreamsRequest.page_size of 0, and the largest page the broker returns.
DEFAULT_LIST_PAGE_SIZE = 1000
MAX_LIST_PAGE_SIZE = 10_000

# Largest gRPC message in either direction: the broker's default
# grpc_max_message_bytes and the limit every client channel is opened with, so
# a full default fetch or a 4 MiB publish chunk never meets gRPC's 4 MiB default.
GRPC_MAX_MESSAGE_BYTES = 64 << 20

# The bounds of one PublishManyRequest (entries, wire bytes): the broker refuses
# a larger one whole with INVALID_ARGUMENT naming the bound, and the SDK's
# publish_many splits its entries below them. 10,000 one-message entries are
# ~0.5 MiB; the byte bound keeps one request's data a few of PublishStream's
# ~4 MiB requests, well inside the publish memory budget and gRPC's limit.
MAX_PUBLISH_MANY_ENTRIES = 10_000
MAX_PUBLISH_MANY_BYTES = 16 << 20

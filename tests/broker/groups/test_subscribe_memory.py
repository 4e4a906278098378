"""A subscriber that grants credits and reads nothing holds a bounded part of the broker.

Issue 34 item 5: four raw Subscribe calls with 2^31-1 credits on a 200 MB
stream that never read their replies grew the broker by 2.1 GB: a lease was
bounded by a message count (10,000) only, so with 100 KB messages one
Subscribe batch, and the group's read-ahead behind it, were 1 GB. Now a lease
holds about LEASE_MAX_BYTES of rows (at least one message), unused credits
are capped, and a call whose client does not read blocks on gRPC's send of
its one batch before it leases more.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pyarrow as pa
import pytest

from harness import BrokerProcess
from npstream import Client
from npstream.proto import pb
from npstream.proto.field_ranges import MAX_SUBSCRIBE_CREDITS

MIB = 1 << 20
STREAM = "wide"
VALUE_BYTES, MESSAGES = 100_000, 1_500  # 150 MB of 100 KB messages
CALLS = 4
# Measured: ~50 MiB per subscriber that reads nothing (a batch, its encoding, the
# group's read-ahead); before, each of these calls held the whole stream and more.
PER_CALL_BOUND = 64 * MIB


def _requests(group: str, stop: threading.Event) -> Iterator[bytes]:
    opening = pb.SubscribeRequest(credits=MAX_SUBSCRIBE_CREDITS)
    opening.open.stream, opening.open.group, opening.open.member_id = STREAM, group, "m"
    opening.open.arrow_deliveries = True
    yield opening.SerializeToString()
    for _ in range(20):  # more credits than the cap: they stay capped
        yield pb.SubscribeRequest(credits=MAX_SUBSCRIBE_CREDITS).SerializeToString()
    stop.wait()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["Subscribe", "SubscribeBatches"])
def test_subscribers_that_never_read_hold_a_bounded_memory(
        broker_factory: object, method: str) -> None:
    broker: BrokerProcess = broker_factory()  # type: ignore[operator]
    with Client(broker.address) as client:
        client.create_stream(STREAM)
        for _ in range(MESSAGES // 100):
            client.publish_batch(STREAM, pa.table({"value": [b"v" * VALUE_BYTES] * 100}))
    idle = peak = broker.rss()
    stop = threading.Event()
    channels = [grpc.insecure_channel(broker.address) for _ in range(CALLS)]
    calls = [channel.stream_stream(f"/npstream.v1.GroupService/{method}")(
        _requests(f"g{i}", stop)) for i, channel in enumerate(channels)]
    try:
        for _ in range(16):  # 8 s: every call has leased what it will by then
            stop.wait(0.5)
            peak = max(peak, broker.rss())
        with Client(broker.address) as client:
            in_flight = [client.describe_group(STREAM, f"g{i}").in_flight for i in range(CALLS)]
    finally:
        stop.set()
        for call in calls:
            call.cancel()
        for channel in channels:
            channel.close()
    assert peak - idle < CALLS * PER_CALL_BOUND, f"grew by {(peak - idle) / MIB:.0f} MiB"
    # Each call was served. (How many: what the client's transport accepted unread, its
    # memory, not the broker's: gRPC grows a connection's window as it goes.)
    assert all(n > 0 for n in in_flight), in_flight

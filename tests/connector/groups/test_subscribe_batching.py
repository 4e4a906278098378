"""Batched push delivery: SubscribeBatches on a real broker, and the client's ack/credit outbox."""

from __future__ import annotations

import queue
import threading
import time

import grpc
import pyarrow as pa
import pytest

from npstream import Client
from npstream.broker.groups.tuning import ARROW_DELIVERIES_MIN_ROWS
from npstream.groups.outbox import ACK_FLUSH_INTERVAL_S, Outbox
from npstream.groups.subscription import SubscriptionCounters, SubscriptionStats
from npstream.proto import pb, pb_grpc
from npstream.proto.schema import DELIVERY_SCHEMA


def wait_until(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_subscribe_busy_stream_arrives_in_few_batches_and_acks_share_requests(broker_factory):
    broker = broker_factory()
    with Client(broker.address) as client:
        client.create_stream("s")
        client.publish_batch("s", [{"value": f"m{i}"} for i in range(2000)])
        handled: list[int] = []
        lock = threading.Lock()

        def handle(lease) -> None:
            with lock:
                handled.append(lease.offset)

        sub = client.subscribe("s", "g", handle, max_in_flight=100)
        try:
            wait_until(lambda: len(handled) >= 2000, what="2000 deliveries")
            wait_until(lambda: client.describe_group("s", "g").committed_offset == 2000,
                       what="committed offset 2000")
        finally:
            sub.stop()
        stats = sub.stats()
        info = client.describe_group("s", "g")
    assert sorted(handled) == list(range(2000))  # each once, none lost
    assert (info.in_flight, info.lag) == (0, 0)
    assert (stats.deliveries, stats.acks, stats.nacks) == (2000, 2000, 0)
    # One stream message per delivery and one request per ack is what batching removes:
    # the first batch alone carries all 100 opening credits' worth.
    assert stats.batches * 5 <= stats.deliveries, stats
    assert stats.requests * 5 <= stats.acks, stats
    assert stats.credits <= 2000 + 100  # flow control: a credit per settled lease, no more
    # The broker counts the same stream messages and requests (only this call ran).
    metrics = broker.metrics()
    assert metrics["npstream_group_deliveries_total"] == 2000
    assert metrics["npstream_group_subscribe_messages_total"] == stats.batches
    assert metrics["npstream_group_subscribe_requests_total"] == stats.requests


def test_subscribe_lone_message_is_delivered_and_acked_promptly(client, stream_name):
    client.create_stream(stream_name)
    handled = threading.Event()
    done_at: list[float] = []

    def handle(lease) -> None:
        done_at.append(time.monotonic())
        handled.set()

    with client.subscribe(stream_name, "g", handle, max_in_flight=100) as sub:
        sent_at = time.monotonic()
        client.publish(stream_name, "only")
        assert handled.wait(10)
        wait_until(lambda: client.describe_group(stream_name, "g").committed_offset == 1,
                   timeout=10, what="the ack")
        acked_at = time.monotonic()
        stats = sub.stats()
    assert done_at[0] - sent_at < 2.0  # no batch to fill: sent as soon as it was there
    assert acked_at - done_at[0] < 2.0  # its ack did not wait for company
    assert (stats.deliveries, stats.batches, stats.acks) == (1, 1, 1)


def delivered(batch: pb.DeliveryBatch) -> list[tuple[int, str, int]]:
    """(offset, value, attempt) of a DeliveryBatch, from whichever form it carries."""
    if not batch.count:
        return [(d.offset, d.value.decode(), d.attempt) for d in batch.deliveries]
    assert not batch.deliveries
    table = pa.ipc.open_stream(pa.py_buffer(batch.arrow_stream)).read_all()
    assert table.schema == DELIVERY_SCHEMA and table.num_rows == batch.count
    return list(zip(table.column("offset").to_pylist(),
                    [v.decode() for v in table.column("value").to_pylist()],
                    table.column("attempt").to_pylist(), strict=True))


@pytest.mark.parametrize("arrow", [False, True], ids=["protobuf", "arrow"])
def test_subscribe_batches_never_exceed_credits_and_take_all_ready(client, stream_name, arrow):
    """Raw SubscribeBatches: one message holds every ready delivery that fits the credits.

    In either form: repeated Delivery messages (what older clients ask for)
    or, for a batch of ARROW_DELIVERIES_MIN_ROWS or more, one Arrow batch
    (``Open.arrow_deliveries``, what the SDK asks for).
    """
    client.create_stream(stream_name)
    client.publish_batch(stream_name, [{"value": f"m{i}"} for i in range(10)])
    requests: queue.SimpleQueue = queue.SimpleQueue()
    opening = pb.SubscribeRequest(credits=3)
    opening.open.CopyFrom(pb.SubscribeRequest.Open(stream=stream_name, group="fc",
                                                   member_id="raw", arrow_deliveries=arrow))
    requests.put(opening)

    def request_iter():
        while (item := requests.get()) is not None:
            yield item

    channel = grpc.insecure_channel(client.address)
    call = pb_grpc.GroupServiceStub(channel).SubscribeBatches(request_iter())
    batches: queue.SimpleQueue = queue.SimpleQueue()
    forms: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        try:
            for batch in call:
                forms.put("arrow" if batch.count else "protobuf")
                batches.put(delivered(batch))
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.CANCELLED  # by the finally below

    threading.Thread(target=read, daemon=True).start()
    try:
        assert batches.get(timeout=10) == [(i, f"m{i}", 1) for i in range(3)]
        time.sleep(0.4)
        assert batches.empty()  # no credit, no delivery, although 7 are waiting
        requests.put(pb.SubscribeRequest(ack_offsets=[0, 1, 2], credits=5))
        assert batches.get(timeout=10) == [(i, f"m{i}", 1) for i in range(3, 8)]
        time.sleep(0.4)
        assert batches.empty()
        info = client.describe_group(stream_name, "fc")
        assert (info.in_flight, info.committed_offset) == (5, 3)
        # A nacked range comes back first, as its second attempt.
        requests.put(pb.SubscribeRequest(nack_ranges=[pb.OffsetRange(start=3, end=5)],
                                         ack_ranges=[pb.OffsetRange(start=5, end=8)],
                                         credits=3))
        assert batches.get(timeout=10) == [(3, "m3", 2), (4, "m4", 2), (8, "m8", 1)]
        # Small batches are protobuf either way (a lone message's latency); a big one
        # is Arrow when asked for.
        assert [forms.get(timeout=1) for _ in range(3)] == ["protobuf"] * 3
        big = ARROW_DELIVERIES_MIN_ROWS + 10
        client.publish_batch(stream_name, [{"value": f"m{i}"} for i in range(10, 10 + big)])
        requests.put(pb.SubscribeRequest(ack_ranges=[pb.OffsetRange(start=3, end=9)],
                                         credits=big + 1))
        assert batches.get(timeout=10) == [(i, f"m{i}", 1) for i in range(9, 10 + big)]
        assert forms.get(timeout=1) == ("arrow" if arrow else "protobuf")
    finally:
        requests.put(None)
        call.cancel()
        channel.close()


# ---------------------------------------------------------------- the client's outbox


def acked(request: pb.SubscribeRequest) -> list[tuple[int, int]]:
    """The acks of a request: the outbox sends them as [start, end) ranges."""
    assert not request.ack_offsets
    return [(r.start, r.end) for r in request.ack_ranges]


def test_outbox_acks_travel_as_ranges_of_consecutive_offsets():
    connection = opened()
    out = sent_by(connection)
    out.get(timeout=5)  # the opening
    for offset in (12, 10, 11, 15, 13, 20, 11):  # out of order, one twice
        assert connection.ack(offset)
    connection.close()
    _t, request = out.get(timeout=5)
    assert acked(request) == [(10, 14), (15, 16), (20, 21)]
    assert out.get(timeout=5) is None


def opened(credits: int = 4) -> Outbox:
    opening = pb.SubscribeRequest(credits=credits)
    opening.open.stream = "s"
    return Outbox(opening, credit_batch=4, counters=SubscriptionCounters())


def free_slots(connection: Outbox, count: int) -> None:
    """``count`` handlers finished with their leases settled: their credits are queued."""
    with connection._lock:
        for _ in range(count):
            connection.finish_locked(None, True)


def sent_by(connection: Outbox) -> queue.SimpleQueue:
    """Run the request iterator like gRPC's sender thread; (monotonic time, request) items."""
    out: queue.SimpleQueue = queue.SimpleQueue()

    def run() -> None:
        for request in connection.request_iterator():
            out.put((time.monotonic(), request))
        out.put(None)

    threading.Thread(target=run, daemon=True).start()
    return out


def test_outbox_sends_opening_at_once_and_coalesces_acks_until_the_interval():
    connection = opened()
    out = sent_by(connection)
    _t, first = out.get(timeout=5)
    assert first.HasField("open") and first.credits == 4
    added_at = time.monotonic()
    for offset in (0, 1, 2):
        assert connection.ack(offset)
    free_slots(connection, 3)  # below credit_batch (4): waits for the interval
    sent_at, request = out.get(timeout=5)
    assert acked(request) == [(0, 3)] and request.credits == 3
    assert sent_at - added_at >= ACK_FLUSH_INTERVAL_S * 0.9
    assert out.empty()
    connection.close()
    assert out.get(timeout=5) is None


def test_outbox_sends_at_once_when_a_credit_batch_is_free():
    connection = opened()
    out = sent_by(connection)
    out.get(timeout=5)  # the opening
    time.sleep(0.05)
    connection.ack(7)
    free_slots(connection, 4)
    _t, request = out.get(timeout=5)
    assert (acked(request), request.credits) == ([(7, 8)], 4)
    connection.close()
    assert out.get(timeout=5) is None


def test_outbox_nacks_per_delay_and_close_flushes_everything_before_half_close():
    connection = opened()
    out = sent_by(connection)
    out.get(timeout=5)
    with connection._cond:  # queue everything before the sender can look
        connection._acks.append(1)
        connection._nacks.update({0: [2, 3], 5000: [4]})
        connection._nacked = 3
        connection._since = time.monotonic()
        connection.open = False
        connection._cond.notify()
    sent = []
    while (item := out.get(timeout=5)) is not None:
        sent.append(item[1])
    assert [(acked(r), list(r.nack_offsets), r.nack_delay_ms, r.credits)
            for r in sent] == [([(1, 2)], [2, 3], 0, 0), ([], [4], 5000, 0)]
    assert not connection.ack(9)  # closed: the caller settles with a unary call instead
    assert connection._counters.snapshot() == SubscriptionStats(
        requests=3, acks=1, nacks=3, credits=4)


def test_outbox_parked_sender_wakes_for_a_lone_ack_and_lingering_one_finds_it():
    """After a send the sender lingers an interval (no wake-up needed for the next item);
    once parked, the first item wakes it. Either way an item waits about one interval."""
    connection = opened()
    out = sent_by(connection)
    out.get(timeout=5)  # the opening; the sender lingers, then parks
    time.sleep(ACK_FLUSH_INTERVAL_S * 20)
    added_at = time.monotonic()
    assert connection.ack(3)  # parked: this wakes it to start the interval
    sent_at, request = out.get(timeout=5)
    assert acked(request) == [(3, 4)]
    assert ACK_FLUSH_INTERVAL_S * 0.9 <= sent_at - added_at < 1.0
    added_at = time.monotonic()
    assert connection.ack(4)  # right after a send: the lingering sender finds it
    sent_at, request = out.get(timeout=5)
    assert acked(request) == [(4, 5)]
    assert sent_at - added_at < 1.0
    connection.close()
    assert out.get(timeout=5) is None


def test_outbox_finish_queues_ack_and_credit_together_and_refuses_when_closed():
    connection = opened()
    out = sent_by(connection)
    out.get(timeout=5)
    with connection._lock:
        assert connection.finish_locked(5, True) is False  # 1 credit of 4: not due yet
        assert connection.finish_locked(None, True) is False  # settled by its handler
        assert connection.finish_locked(6, False) is False  # stopping: no credit
        assert connection.finish_locked(7, True) is False
        assert connection.finish_locked(None, True) is True  # the 4th credit: due
    _t, request = out.get(timeout=5)
    assert (acked(request), request.credits) == ([(5, 8)], 4)
    connection.close()
    assert out.get(timeout=5) is None
    with connection._lock:
        assert connection.finish_locked(9, True) is None  # closed: the caller acks by a call


def test_lease_settle_goes_to_the_open_outbox_then_to_the_fallback():
    from npstream.groups.leases import Lease

    fallback: list[tuple[int, str, int]] = []
    connection = Outbox(pb.SubscribeRequest(credits=4), credit_batch=4,
                        counters=SubscriptionCounters(),
                        closed=lambda lease, how, delay: fallback.append(
                            (lease.offset, how, delay)))
    out = sent_by(connection)
    out.get(timeout=5)
    first, second, third = (Lease("s", "g", offset, f"i{offset}", None, b"v", {}, 0, 1, 0,
                                  connection.settle) for offset in (1, 2, 3))
    first.ack()
    first.ack()  # settling twice is a no-op
    second.nack(delay=0.25)
    connection.close()
    _t, request = out.get(timeout=5)
    assert (acked(request), list(request.nack_offsets), request.nack_delay_ms) == (
        [(1, 2)], [2], 250)
    assert out.get(timeout=5) is None
    third.ack()  # the call is closed: the subscription's fallback settles it
    assert fallback == [(3, "ack", 0)]
    assert (first.settled, second.settled, third.settled) == ("ack", "nack", "ack")


def test_outbox_acks_appended_without_the_lock_are_all_sent_or_handed_on():
    """Handlers append acks without the lock while the sender takes them and the call
    closes: every ack is sent on the stream or given to the fallback, none is lost."""
    from npstream.groups.leases import Lease

    fallback: list[int] = []
    fallback_lock = threading.Lock()

    def closed(lease, how, delay) -> None:
        with fallback_lock:
            fallback.append(lease.offset)

    connection = Outbox(pb.SubscribeRequest(credits=4), credit_batch=4,
                        counters=SubscriptionCounters(), closed=closed)
    out = sent_by(connection)
    out.get(timeout=5)
    threads = 4
    per_thread = 20_000

    def acker(first: int) -> None:
        for offset in range(first, first + per_thread):
            Lease("s", "g", offset, "", None, b"", {}, 0, 1, 0, connection.settle).ack()

    workers = [threading.Thread(target=acker, args=(i * per_thread,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(0.02)
    connection.close()  # while they are still acking
    for worker in workers:
        worker.join()
    sent: list[int] = []
    while (item := out.get(timeout=5)) is not None:
        sent.extend(o for start, end in acked(item[1]) for o in range(start, end))
    assert sorted(set(sent) | set(fallback)) == list(range(threads * per_thread))
    assert len(sent) == len(set(sent))  # each sent once; a raced one may also be handed on

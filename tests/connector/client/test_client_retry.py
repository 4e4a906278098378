"""Connection loss against real broker processes: retries, restarts, BrokerUnavailable."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from npstream import BrokerUnavailable, Client
from npstream.proto import pb


def _restart_after(broker, delay: float, *, hard: bool = False) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        broker.restart(hard=hard)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_calls_during_broker_restart_are_retried_and_succeed(broker_factory):
    broker = broker_factory()
    with Client(broker.address, retry_deadline=30) as client:
        client.publish("orders", "before", id="m1")
        broker.stop()
        thread = _restart_after(broker, 0.5)
        try:
            info = client.stream_info("orders")  # refused until the broker is back
            result = client.publish("orders", "after")  # no id, but never reached: retried
        finally:
            thread.join()
        assert info.end_offset == 1
        assert result.offset == 1
        assert client.fetch("orders", 0).column("value").to_pylist() == [b"before", b"after"]


def test_stage_during_broker_restart_is_retried_and_commits(broker_factory):
    broker = broker_factory()
    with Client(broker.address, retry_deadline=30) as client:
        sink = client.sink()
        broker.stop()
        thread = _restart_after(broker, 0.5)
        try:  # Stage sends wire bytes (call_serialized): retried like any idempotent call
            staged = sink.stage("s-retry", 0, "0-0", "orders", pa.table({"value": ["a", "b"]}))
        finally:
            thread.join()
        assert staged.rows == 2
        assert sink.commit("s-retry", 0, ["0-0"]).written == {"orders": (0, 2)}
        assert client.fetch("orders", 0).column("value").to_pylist() == [b"a", b"b"]


def test_long_poll_in_flight_when_broker_dies_is_retried_after_restart(broker_factory):
    broker = broker_factory()
    with Client(broker.address, retry_deadline=30) as client:
        client.create_stream("s")
        thread = _restart_after(broker, 0.5, hard=True)
        try:
            # Idempotent: the broken long poll is sent again to the restarted broker.
            assert client.fetch("s", 0, wait=2.0).num_rows == 0
        finally:
            thread.join()
        assert client.publish("s", "x").offset == 0


def test_non_idempotent_call_in_flight_when_broker_dies_is_not_retried(broker_factory):
    broker = broker_factory()
    with Client(broker.address, retry_deadline=30) as client:
        client.create_stream("s")
        killer = threading.Timer(0.5, broker.kill)
        killer.start()
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable) as err:
            client.call("StreamService.Fetch", pb.FetchRequest(stream="s", wait_ms=10_000),
                        idempotent=False)
        killer.join()
        assert time.monotonic() - started < 5.0
    message = str(err.value)
    assert message.startswith(f"broker at {broker.address} is unavailable: ")
    assert "the request may or may not have been stored" in message


def test_broker_down_past_retry_deadline_raises_broker_unavailable(broker_factory):
    broker = broker_factory()
    with Client(broker.address, retry_deadline=1.0) as client:
        client.create_stream("s")
        broker.stop()
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable) as err:
            client.publish("s", "lost?", id="m-1")
        elapsed = time.monotonic() - started
    assert str(err.value).startswith(f"broker at {broker.address} is unavailable: ")
    assert "over 1s" in str(err.value)
    assert 0.9 <= elapsed < 6.0

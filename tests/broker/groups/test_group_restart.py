"""Group positions and dead-letter counts survive kill -9; leases do not (at-least-once)."""

from __future__ import annotations

from npstream import Client
from npstream.groups.shared import ack_leases


def test_positions_and_dead_letter_counts_survive_kill_9(broker_factory):
    broker = broker_factory()
    with Client(broker.address) as client:
        client.create_stream("events")
        client.publish_batch("events", [{"value": f"e{i}"} for i in range(6)])
        assert client.consumer("events", "cursor").pull(limit=3).offsets == [0, 1, 2]
        okmq = client.consumer("events", "okmq")
        okmq.pull(limit=5, auto_commit=False)
        okmq.commit(3)
        leases = client.receive("events", "shared", max=6, max_deliver=1)
        assert ack_leases(client, leases[:2]) == 2
        leases[2].nack()  # last attempt: dead-lettered before nack() returns its answer
        assert client.describe_group("events", "shared").dead_lettered == 1

    broker.restart(hard=True)

    with Client(broker.address) as client:
        groups = {g.group: g for g in client.list_groups("events")}
        assert {name: (g.kind, g.committed_offset) for name, g in groups.items()} == {
            "cursor": ("cursor", 3), "okmq": ("cursor", 4), "shared": ("shared", 3)}
        shared = groups["shared"]
        assert (shared.dead_lettered, shared.in_flight, shared.lag) == (1, 0, 3)
        assert shared.settings.max_deliver == 1
        # Leases are not persisted: the unacked messages come again, as first attempts.
        again = client.receive("events", "shared", max=10, max_deliver=1)
        assert [(lease.offset, lease.attempt) for lease in again] == [(3, 1), (4, 1), (5, 1)]
        assert client.fetch("events.dlq", 0).column("value").to_pylist() == [b"e2"]
        assert client.consumer("events", "cursor").pull().offsets == [3, 4, 5]


def test_graceful_restart_keeps_positions_written_by_subscribe_acks(broker_factory):
    broker = broker_factory()
    with Client(broker.address) as client:
        client.create_stream("s")
        client.publish_batch("s", [{"value": str(i)} for i in range(20)])
        seen: list[int] = []
        sub = client.subscribe("s", "g", lambda lease: seen.append(lease.offset))
        import time

        deadline = time.monotonic() + 20
        while client.describe_group("s", "g").committed_offset < 20:
            assert time.monotonic() < deadline, "acks did not arrive"
            time.sleep(0.05)
        sub.stop()
    assert broker.stop() == 0
    broker.start()
    with Client(broker.address) as client:
        assert client.describe_group("s", "g").committed_offset == 20
        assert client.receive("s", "g") == []


def test_stop_with_open_subscription_is_quick_and_subscription_resumes(broker_factory):
    import time

    broker = broker_factory()
    with Client(broker.address) as client:
        client.create_stream("s")
        seen: list[bytes] = []
        sub = client.subscribe("s", "g", lambda lease: seen.append(lease.value))
        client.publish("s", "before")
        deadline = time.monotonic() + 15
        while seen != [b"before"]:
            assert time.monotonic() < deadline, seen
            time.sleep(0.02)
        # The handler ran; its ack travels after it. Stop only once the broker has
        # it, or "before" is (rightly) delivered again after the restart.
        while client.describe_group("s", "g").committed_offset != 1:
            assert time.monotonic() < deadline, client.describe_group("s", "g")
            time.sleep(0.02)
        started = time.monotonic()
        assert broker.stop() == 0
        assert time.monotonic() - started < 5.0  # not the 10 s shutdown grace
        broker.start()
        client.publish("s", "after")
        deadline = time.monotonic() + 20
        while seen != [b"before", b"after"]:
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
        assert sub.running
        sub.stop()

"""Shared groups ordered by key (ordering="key") on a real broker.

The bookkeeping alone: tests/broker/groups/test_key_order.py and test_leases.py.
"""

from __future__ import annotations

import random
import threading
import time

from npstream import Client
from npstream.errors import GroupNotFound


def publish_keyed(client: Client, stream: str, keys: list[str | None]) -> None:
    client.create_stream(stream, exist_ok=True)
    client.publish_batch(stream, [{"value": f"v{i}", **({"key": k} if k else {})}
                                  for i, k in enumerate(keys)])


def test_a_key_is_never_delivered_twice_at_once_and_keyless_messages_are_free(
        client, stream_name):
    publish_keyed(client, stream_name, ["a", "a", None, "b", None, "a", "b"])
    first = client.receive_batch(stream_name, "g", max=10, ordering="key")
    assert first.offsets.tolist() == [0, 2, 3, 4]
    assert client.receive_batch(stream_name, "g", max=10).offsets.tolist() == []
    first.nack([0])  # the nacked one comes back before anything later of its key
    again = client.receive_batch(stream_name, "g", max=10)
    assert again.offsets.tolist() == [0]
    assert again.table.column("attempt").to_pylist() == [2]
    again.ack()
    first.ack([3])
    assert client.receive_batch(stream_name, "g", max=10, wait=2).offsets.tolist() == [1, 6]
    info = client.describe_group(stream_name, "g")
    assert info.settings is not None and info.settings.ordering == "key"


def test_four_members_with_nacks_and_expiries_process_each_key_in_offset_order(
        client, stream_name):
    rng = random.Random(16)
    keys = [f"k{rng.randint(0, 24)}" for _ in range(1500)]
    publish_keyed(client, stream_name, keys)
    processed: dict[str, list[int]] = {}
    lock = threading.Lock()
    done = threading.Event()

    def member(index: int) -> None:
        local = random.Random(index)
        with Client(client.address) as own:
            while not done.is_set():
                # ack_wait leaves room for a loaded machine: a lease that expires while its
                # member still holds it is delivered again, and then processed twice.
                leases = own.receive(stream_name, "workers", max=20, wait=0.2, ack_wait=1.5,
                                     ordering="key", member_id=f"m{index}")
                for lease in leases:
                    roll = local.random()
                    if roll < 0.1:
                        lease.nack()
                    elif roll < 0.15:
                        continue  # let the lease expire
                    else:
                        with lock:
                            processed.setdefault(lease.key.decode(), []).append(lease.offset)
                        lease.ack()

    threads = [threading.Thread(target=member, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:  # the members' first receive creates the group
            if client.describe_group(stream_name, "workers").committed_offset == len(keys):
                break
        except GroupNotFound:
            pass
        time.sleep(0.1)
    done.set()
    for thread in threads:
        thread.join(30)
    expected: dict[str, list[int]] = {}
    for offset, key in enumerate(keys):
        expected.setdefault(key, []).append(offset)
    assert processed == expected  # every message once, each key in offset order


def test_switching_ordering_off_releases_held_messages(client, stream_name):
    publish_keyed(client, stream_name, ["a", "a", "a"])
    held = client.receive_batch(stream_name, "g", max=10, ordering="key")
    assert held.offsets.tolist() == [0]
    rest = client.receive_batch(stream_name, "g", max=10, ordering="none")
    assert rest.offsets.tolist() == [1, 2]
    assert held.ack() + rest.ack() == 3

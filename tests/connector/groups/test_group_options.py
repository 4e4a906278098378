"""GroupOptions: the six shared-group settings as one object, the old keywords still taken."""

from __future__ import annotations

import threading

import pytest

from npstream import Client, GroupOptions
from npstream.errors import InvalidArgument
from npstream.groups.admin import SharedSettings
from npstream.groups.options import group_options

SHIPPING = GroupOptions(ack_wait="2m", max_deliver=5, backoff=[1, 5, 30],
                        dead_letter_stream="orders.failed", ordering="key", member_id="m-1")


def publish(client: Client, stream: str, count: int) -> None:
    client.create_stream(stream)
    for i in range(count):
        client.publish(stream, f"m{i}".encode(), key=f"k{i}".encode())


def test_group_options_are_frozen_and_keep_backoff_as_a_tuple():
    assert SHIPPING.backoff == (1, 5, 30)
    assert hash(SHIPPING) == hash(GroupOptions(ack_wait="2m", max_deliver=5, backoff=(1, 5, 30),
                                               dead_letter_stream="orders.failed",
                                               ordering="key", member_id="m-1"))
    with pytest.raises(AttributeError):
        SHIPPING.max_deliver = 1  # type: ignore[misc]


def test_keywords_win_over_options_and_unknown_keywords_name_the_settings():
    merged = group_options(SHIPPING, {"max_deliver": 9, "member_id": "m-2"}, "receive")
    assert (merged.max_deliver, merged.member_id, merged.ack_wait) == (9, "m-2", "2m")
    assert group_options(None, {}, "receive") == GroupOptions()
    with pytest.raises(TypeError, match=r"receive\(\) got unexpected keyword argument\(s\) "
                                        r"\['max_delivr'\]; the group settings are \['ack_wait', "
                                        r"'backoff', 'dead_letter_stream', 'max_deliver', "
                                        r"'member_id', 'ordering'\]"):
        group_options(None, {"max_delivr": 1}, "receive")
    with pytest.raises(TypeError, match=r"subscribe\(\): options must be a GroupOptions, got dict"):
        group_options({"max_deliver": 1}, {}, "subscribe")  # type: ignore[arg-type]


def test_receive_with_options_stores_the_group_settings(client, stream_name):
    publish(client, stream_name, 3)
    leases = client.receive(stream_name, "shipping", max=3, options=SHIPPING)
    assert [lease.offset for lease in leases] == [0, 1, 2]
    info = client.describe_group(stream_name, "shipping")
    assert info.settings == SharedSettings(ack_wait=120.0, max_deliver=5, backoff=[1.0, 5.0, 30.0],
                                           dead_letter_stream="orders.failed", ordering="key")
    assert [member.member_id for member in info.members] == ["m-1"]


def test_each_consuming_call_takes_options_and_old_keywords(client, stream_name):
    publish(client, stream_name, 4)
    batch = client.receive_batch(stream_name, "g", max=1, options=SHIPPING, max_deliver=7)
    assert batch.table.column("offset").to_pylist() == [0]
    assert batch.member_id == "m-1"
    assert client.describe_group(stream_name, "g").settings.max_deliver == 7
    batch.ack()
    with client.receive_batches(stream_name, "g", max=1, wait=0.0, prefetch=0, until_empty=True,
                                options=SHIPPING, ack_wait=45) as batches:
        offsets = [batch.table.column("offset").to_pylist()[0] for batch in batches]
    assert offsets == [1, 2, 3]
    settings = client.describe_group(stream_name, "g").settings
    assert (settings.ack_wait, settings.max_deliver) == (45.0, 5)
    for i in range(2):
        client.publish(stream_name, f"late{i}".encode())
    seen: list[int] = []
    done = threading.Event()

    def handle(lease) -> None:
        seen.append(lease.offset)
        if len(seen) == 2:
            done.set()

    with client.subscribe(stream_name, "g", handle, options=SHIPPING, member_id="pusher") as sub:
        assert done.wait(10)
        assert sub.member_id == "pusher"
    assert sorted(seen) == [4, 5]
    with pytest.raises(InvalidArgument, match="max_deliver=-1 must be an int >= 0"):
        client.receive(stream_name, "g", options=GroupOptions(max_deliver=-1))

"""The broker's etcd client against a real etcd (the session's ``etcd`` fixture)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from npstream.broker.cluster.etcd.client import (
    Compare,
    EtcdClient,
    EtcdUnavailable,
    Event,
    EventType,
    Op,
    parse_endpoints,
    prefix_end,
)
from npstream.cli.local_etcd import free_port


@pytest.fixture
def client(etcd):
    c = EtcdClient(etcd.endpoint)
    yield c
    c.close()


@pytest.fixture
def prefix() -> str:
    return f"/test/{uuid.uuid4().hex}/"


def _wait_for(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_put_then_get_returns_the_value_and_its_revisions(client, prefix):
    revision = client.put(prefix + "a", b"one")
    kv = client.get(prefix + "a")
    assert kv is not None
    assert (kv.key, kv.value, kv.version, kv.mod_revision, kv.create_revision) == (
        prefix + "a", b"one", 1, revision, revision)
    second = client.put(prefix + "a", b"two")
    kv = client.get(prefix + "a")
    assert (kv.value, kv.version, kv.mod_revision, kv.create_revision) == (
        b"two", 2, second, revision)


def test_get_missing_key_returns_none(client, prefix):
    assert client.get(prefix + "nothing") is None


def test_get_prefix_returns_only_keys_under_the_prefix_sorted(client, prefix):
    for key in ("b", "a", "c/d"):
        client.put(prefix + key, key.encode())
    client.put(prefix[:-1] + "x", b"beside")  # shares the prefix but the slash
    items, revision = client.get_prefix(prefix)
    assert [(kv.key, kv.value) for kv in items] == [
        (prefix + "a", b"a"), (prefix + "b", b"b"), (prefix + "c/d", b"c/d")]
    assert revision >= max(kv.mod_revision for kv in items)


def test_delete_and_delete_prefix_remove_only_their_keys(client, prefix):
    for key in ("a", "b", "sub/c", "sub/d"):
        client.put(prefix + key, b"v")
    assert client.delete(prefix + "a") == 1
    assert client.delete(prefix + "a") == 0
    assert client.delete_prefix(prefix + "sub/") == 2
    assert [kv.key for kv in client.get_prefix(prefix)[0]] == [prefix + "b"]


def test_txn_guarded_by_mod_revision_succeeds_for_one_writer_only(client, prefix):
    key = prefix + "owner"
    client.put(key, b"m1")
    seen = client.get(key)
    assert seen is not None
    first = client.txn([Compare.mod_revision(key, "=", seen.mod_revision)],
                       [Op.put(key, b"m2")], [Op.get(key)])
    second = client.txn([Compare.mod_revision(key, "=", seen.mod_revision)],
                        [Op.put(key, b"m3")], [Op.get(key)])
    assert first.succeeded and first.gets == (None,)
    assert not second.succeeded
    assert second.gets[0] is not None and second.gets[0].value == b"m2"
    assert client.get(key).value == b"m2"


def test_txn_version_zero_creates_only_when_absent(client, prefix):
    key = prefix + "stream"
    create = [Compare.version(key, "=", 0)]
    assert client.txn(create, [Op.put(key, b"first")]).succeeded
    assert not client.txn(create, [Op.put(key, b"second")]).succeeded
    assert client.get(key).value == b"first"


def test_txn_compare_value_and_delete(client, prefix):
    key = prefix + "k"
    client.put(key, b"x")
    assert not client.txn([Compare.value(key, "=", b"y")], [Op.delete(key)]).succeeded
    assert client.txn([Compare.value(key, "=", b"x")], [Op.delete(key)]).succeeded
    assert client.get(key) is None


def test_compare_with_unknown_operator_names_the_accepted_ones():
    with pytest.raises(ValueError, match=r"compare operator '==' is not one of =, !=, <, >"):
        Compare.version("/k", "==", 0)


def test_revoke_deletes_the_keys_of_the_lease(client, prefix):
    lease = client.grant(30)
    client.put(prefix + "member", b"up", lease=lease)
    assert client.get(prefix + "member").lease == lease
    client.revoke(lease)
    assert client.get(prefix + "member") is None
    assert client.time_to_live(lease) == -1
    client.revoke(lease)  # a lease already gone is no error


def test_keep_alive_holds_a_lease_past_its_ttl_and_stopping_lets_it_expire(client, prefix):
    lease = client.grant(2)
    client.put(prefix + "member", b"up", lease=lease)
    lost: list[str] = []
    keeper = client.keep_alive(lease, 2, lost.append)
    time.sleep(4.0)
    assert client.get(prefix + "member") is not None
    keeper.stop()
    _wait_for(lambda: client.get(prefix + "member") is None, timeout=6)
    assert lost == []


def test_keep_alive_reports_a_lease_revoked_elsewhere(client, prefix):
    lease = client.grant(2)
    lost: list[str] = []
    keeper = client.keep_alive(lease, 2, lost.append)
    try:
        client.revoke(lease)
        _wait_for(lambda: lost, timeout=5)
        assert "is gone" in lost[0]
    finally:
        keeper.stop()


def test_watch_prefix_delivers_puts_and_deletes_in_revision_order(client, prefix):
    seen: list[Event] = []
    lock = threading.Lock()

    def on_events(events):
        with lock:
            seen.extend(events or [])

    client.put(prefix + "before", b"0")  # before the watch: not delivered
    watch = client.watch_prefix(prefix, on_events)
    try:
        client.put(prefix + "a", b"1")
        client.put(prefix[:-1] + "-other", b"x")  # outside the prefix
        client.put(prefix + "a", b"2")
        client.delete(prefix + "a")
        _wait_for(lambda: len(seen) >= 3)
        time.sleep(0.2)
        with lock:
            assert [(e.type, e.kv.key, e.kv.value) for e in seen] == [
                (EventType.PUT, prefix + "a", b"1"), (EventType.PUT, prefix + "a", b"2"),
                (EventType.DELETE, prefix + "a", b"")]
    finally:
        watch.cancel()


def test_watch_from_a_revision_replays_the_changes_since(client, prefix):
    _items, revision = client.get_prefix(prefix)
    client.put(prefix + "a", b"1")
    client.put(prefix + "b", b"2")
    seen: list[Event] = []
    watch = client.watch_prefix(prefix, lambda events: seen.extend(events or []),
                                start_revision=revision + 1)
    try:
        _wait_for(lambda: len(seen) >= 2)
        assert [(e.kv.key, e.kv.value) for e in seen] == [(prefix + "a", b"1"),
                                                          (prefix + "b", b"2")]
    finally:
        watch.cancel()


def test_call_moves_to_the_next_endpoint_when_one_does_not_answer(etcd, prefix):
    client = EtcdClient([f"http://127.0.0.1:{free_port()}", etcd.endpoint], timeout_s=1)
    try:
        client.put(prefix + "k", b"v")
        assert client.get(prefix + "k").value == b"v"
    finally:
        client.close()


def test_call_with_no_endpoint_answering_raises_unavailable(prefix):
    dead = f"http://127.0.0.1:{free_port()}"
    client = EtcdClient(dead, timeout_s=0.5)
    try:
        with pytest.raises(EtcdUnavailable, match=f"no etcd endpoint of {dead} answered"):
            client.get(prefix + "k")
    finally:
        client.close()


@pytest.mark.parametrize("bad", ["127.0.0.1:2379", "ftp://h:1", "http://h", "http://h:1/x"])
def test_parse_endpoints_with_bad_entry_names_it_and_the_form(bad):
    with pytest.raises(ValueError, match=f"etcd endpoint '{bad}' is not http://HOST:PORT"):
        parse_endpoints(bad)


def test_parse_endpoints_splits_a_comma_separated_string():
    assert parse_endpoints("http://a:2379, http://b:2379/,") == ("http://a:2379",
                                                                 "http://b:2379")


def test_prefix_end_is_the_next_key_after_every_key_with_the_prefix():
    assert prefix_end("/a/") == b"/a0"
    assert prefix_end("") == b"\0"

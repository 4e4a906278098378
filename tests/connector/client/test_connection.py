"""Connection setup and the retry loop against an address nobody listens on."""

from __future__ import annotations

import re
import socket
import time

import pytest

from npstream import BrokerUnavailable, Client, InvalidArgument, NpstreamError
from npstream.client.connection import resolve_address


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_resolve_address_argument_then_env_then_default(monkeypatch):
    monkeypatch.delenv("NPSTREAM_BROKER", raising=False)
    assert resolve_address(None) == "localhost:7070"
    monkeypatch.setenv("NPSTREAM_BROKER", "10.0.0.1:9000")
    assert resolve_address(None) == "10.0.0.1:9000"
    assert resolve_address("h:1") == "h:1"
    assert Client().address == "10.0.0.1:9000"


def test_call_unreachable_broker_retries_until_deadline_then_names_address():
    address = f"127.0.0.1:{_free_port()}"
    with Client(address, retry_deadline=0.6) as client:
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable) as info:
            client.stream_info("s")
        elapsed = time.monotonic() - started
    message = str(info.value)
    assert message.startswith(f"broker at {address} is unavailable: failed to connect")
    assert "gave up after" in message and "over 0.6s" in message
    attempts = int(message.split("gave up after ")[1].split(" ")[0])
    assert attempts >= 3  # backoff starts at 50 ms: several tries fit in 0.6 s
    assert 0.55 <= elapsed < 5.0


def test_publish_without_id_unreachable_broker_is_retried_since_never_sent():
    address = f"127.0.0.1:{_free_port()}"
    with Client(address, retry_deadline=0.3) as client, pytest.raises(
        BrokerUnavailable, match="gave up after"
    ):
        client.publish("s", b"x")


def test_call_zero_retry_deadline_fails_after_one_attempt():
    with Client(f"127.0.0.1:{_free_port()}", retry_deadline=0) as client, pytest.raises(
        BrokerUnavailable, match=r"gave up after 1 attempt\(s\)"
    ):
        client.end_offsets()


def test_call_unknown_rpc_raises_value_error():
    with Client("127.0.0.1:1") as client, pytest.raises(ValueError, match=r"unknown rpc 'Nope\.X'"):
        client.call("Nope.X", None)


def test_call_after_close_raises_clear_error():
    client = Client("127.0.0.1:1")
    client.close()
    with pytest.raises(NpstreamError, match=r"client for 127\.0\.0\.1:1 is closed"):
        client.stream_info("s")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"timeout": 0}, "timeout must be > 0"),
    ({"retry_deadline": -1}, "retry_deadline must be >= 0"),
])
def test_client_bad_settings_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Client("127.0.0.1:1", **kwargs)


@pytest.mark.parametrize(("call", "message"), [
    (lambda c: c.stream_info("../etc"), "invalid stream name '../etc'"),
    (lambda c: c.create_stream("ok", max_age="7x"), "max_age: invalid duration '7x'"),
    (lambda c: c.create_stream("ok", max_bytes="lots"), "max_bytes: invalid size 'lots'"),
    (lambda c: c.publish("ok", b"v", ack="later"), "invalid ack 'later'"),
    (lambda c: c.publish("ok", b"v", id=3), "id must be str, got int: 3"),
    (lambda c: c.fetch("ok", -1), r"offset=-1 is out of range: accepted 0\.\.9223372036854775807"),
    (lambda c: c.fetch("ok", 2**63),
     r"offset=9223372036854775808 is out of range: accepted 0\.\.9223372036854775807; an offset"),
    (lambda c: c.fetch("ok", 0, end_offset=10**20), r"end_offset=10{20} is out of range"),
    (lambda c: c.fetch("ok", 0, wait=1e20), r"wait must be seconds within 0\.\."),
    (lambda c: c.fetch("ok", 0, max_messages=2**31),
     r"max_messages=2147483648 is out of range: accepted 0\.\.2147483647"),
    (lambda c: c.receive("ok", "g", max=2**31),
     r"max=2147483648 is out of range: accepted 0\.\.2147483647"),
    (lambda c: c.consumer("ok", "g", start_from=2**63),
     r"start_from=9223372036854775808 is out of range: accepted 0\.\.9223372036854775807"),
    (lambda c: c.consumer("ok", "g", start_from={"offset": -1}),
     r"start_from=-1 is out of range: accepted 0\.\."),
    (lambda c: c.delete_messages("ok", 10**20),
     r"before_offset=10{20} is out of range: accepted 0\.\.9223372036854775807; an offset"),
    (lambda c: c.offset_for_timestamp("ok", "yesterday"), "ts: invalid timestamp"),
    (lambda c: c.delete_messages("ok", before_offset=-5),
     r"before_offset=-5 is out of range: accepted 0\.\."),
    (lambda c: list(c.read_range("ok", 5, 2)), "end 2 is before start 5"),
])
def test_client_bad_arguments_fail_before_any_call(call, message):
    # The address is unreachable: reaching the broker would raise BrokerUnavailable instead.
    with Client("127.0.0.1:1", retry_deadline=0) as client, pytest.raises(
        InvalidArgument, match=message
    ):
        call(client)


def test_import_npstream_loads_neither_pyspark_nor_pandas():
    import subprocess
    import sys

    code = "import sys, npstream; print(sorted({'pyspark', 'pandas'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("address", ["localhost", "[::1]", "host:0", "host:70000", "a b:1",
                                     "h:port"])
def test_client_address_without_valid_port_is_refused_before_any_call(address):
    with pytest.raises(InvalidArgument, match=re.escape(f"invalid broker address '{address}'")):
        Client(address)


@pytest.mark.parametrize("address", ["localhost:7070", "10.0.0.1:1", "[::1]:7070",
                                     "dns:///broker:7070", "unix:/tmp/np.sock"])
def test_client_address_forms_are_accepted(address):
    with Client(address) as client:
        assert client.address == address

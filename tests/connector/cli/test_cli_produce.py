"""`npstream produce` as the docs' users run it: rights, summaries (issue 34, items 13 and 20)."""

from __future__ import annotations

import pytest

from npstream import Client

ADMIN, PRODUCER = "admin-secret", "producer-secret"


@pytest.fixture
def auth_broker(broker_factory, tmp_path):
    """A broker with docs/security.md's tokens: a write-only producer and an admin."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f"""
[[tokens]]
name = "orders-producer"
token = "{PRODUCER}"
write = ["orders*"]

[[tokens]]
name = "ops"
token = "{ADMIN}"
admin = ["*"]
read = ["*"]
write = ["*"]
""")
    return broker_factory(args=["--tokens-file", str(tokens)])


def test_produce_write_only_token_publishes_every_line(auth_broker, cli_at):
    with Client(auth_broker.address, ADMIN) as admin:
        admin.create_stream("orders")
        result = cli_at(auth_broker.address, "produce", "orders", "--id-field", "id",
                              token=PRODUCER, stdin='{"id": "o-1"}\n{"id": "o-2"}\n')
        assert (result.returncode, result.stderr) == (0, "")
        assert result.stdout == ("produced 2 message(s) to 'orders': first offset 0, "
                                 "last offset 1, 0 duplicate(s)\n")
        table = admin.fetch("orders", 0)
    assert table.column("id").to_pylist() == ["o-1", "o-2"]
    assert table.column("value").to_pylist() == [b'{"id": "o-1"}', b'{"id": "o-2"}']


def test_produce_write_only_token_into_typed_stream_is_checked_by_the_broker(auth_broker,
                                                                               cli_at):
    with Client(auth_broker.address, ADMIN) as admin:
        admin.create_stream("orders-typed", schema="sensorId STRING NOT NULL, reading DOUBLE")
        good = cli_at(auth_broker.address, "produce", "orders-typed", token=PRODUCER,
                            stdin='{"sensorId": "s1", "reading": 21.5}\n')
        assert (good.returncode, good.stderr) == (0, ""), good.stderr
        bad = cli_at(auth_broker.address, "produce", "orders-typed", token=PRODUCER,
                           stdin='{"sensorId": "s2", "reading": "warm"}\n')
        assert bad.returncode == 1
        assert bad.stdout == "produced 0 message(s) to 'orders-typed'\n"
        assert "reading" in bad.stderr and "lines 1..1 of stdin were not all produced" in bad.stderr
        assert admin.stream_info("orders-typed").end_offset == 1


def test_produce_all_lines_refused_prints_the_documented_zero_summary(auth_broker, cli_at):
    with Client(auth_broker.address, ADMIN) as admin:
        admin.create_stream("other")
    result = cli_at(auth_broker.address, "produce", "other", token=PRODUCER,
                          stdin='{"a": 1}\n')
    assert result.returncode == 1
    assert result.stdout == "produced 0 message(s) to 'other'\n"
    assert result.stderr.startswith(
        "npstream: error: permission denied: token 'orders-producer' lacks the 'write' right "
        "on stream 'other'")

"""Errors in the CLI's own words (issue 34, item 16).

The broker and the SDK name what a program passes (``exist_ok``,
``update_stream``, gRPC metadata); each error the CLI prints names its own
flag or command instead. Every case runs the installed ``npstream`` against
a real broker; the SDK's messages themselves stay as they are.
"""

from __future__ import annotations

import pytest

from npstream import AlreadyExists, Client

SDK_WORDS = ("exist_ok", "update_stream", "delete_messages", "send metadata", "pull/commit",
             "receive/subscribe", "max_message_bytes=", "start_offset=", "retry_deadline",
             "StreamConfig(")


def error_line(result) -> str:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("npstream: error: "), result.stderr
    assert not [word for word in SDK_WORDS if word in lines[0]], lines[0]
    return lines[0].removeprefix("npstream: error: ")


def test_create_with_other_config_names_exist_ok_flag(cli, client, stream_name):
    client.create_stream(stream_name, max_age="7d")
    with pytest.raises(AlreadyExists, match="pass exist_ok"):  # the SDK keeps its words
        client.create_stream(stream_name, max_age="1d")
    message = error_line(cli("streams", "create", stream_name, "--max-age", "1d"))
    assert message == (
        f"stream '{stream_name}' already exists with a different config: existing (--max-age "
        "604800000ms --max-bytes 1073741824 --dedup-window 120000ms --max-message-bytes "
        "1048576), requested (--max-age 86400000ms --max-bytes 1073741824 --dedup-window "
        "120000ms --max-message-bytes 1048576); add --exist-ok to keep the existing one")


def test_create_with_other_schema_names_exist_ok_and_streams_update(cli, client, stream_name):
    client.create_stream(stream_name, schema="a INT")
    message = error_line(cli("streams", "create", stream_name, "--schema", "a STRING"))
    assert message.endswith(
        f"requested 'a STRING'; add --exist-ok to keep the existing one, or evolve the schema "
        f"with `npstream streams update {stream_name} --schema SCHEMA`")


def test_create_with_empty_schema_names_the_flag_and_no_python_types(cli, stream_name):
    assert error_line(cli("streams", "create", stream_name, "--schema", "")) == (
        "--schema is empty: give DDL ('a INT, b STRING') or Spark's StructType JSON (leave "
        "--schema out for an untyped stream)")


def test_move_on_a_single_broker_names_the_cluster_flag(cli, client, stream_name):
    client.create_stream(stream_name)
    assert error_line(cli("streams", "move", stream_name, "--to", "127.0.0.1:1")).endswith(
        "(`npstream broker --etcd`, or [cluster] etcd in its config)")


def test_update_untyped_stream_with_messages_names_streams_truncate(cli, client, stream_name):
    client.publish(stream_name, b"x")
    message = error_line(cli("streams", "update", stream_name, "--schema", "a INT"))
    assert message.endswith(f"delete its messages first (`npstream streams truncate "
                            f"{stream_name} --all`) or use a new stream")


def test_consume_cursor_command_on_shared_group_names_the_commands(cli, client, stream_name):
    client.publish(stream_name, b"x")
    client.receive(stream_name, "shipping", max=1)
    message = error_line(cli("consume", stream_name, "--group", "shipping"))
    assert message == (
        f"group 'shipping' on stream '{stream_name}' is a shared group (`npstream groups "
        "receive/ack/nack`); `npstream consume --group` needs a cursor group: use another "
        f"group name or delete this one (`npstream groups delete {stream_name} shipping`)")


def test_produce_too_large_line_names_max_message_bytes_flag(cli, client, stream_name):
    client.create_stream(stream_name, max_message_bytes="1KiB")
    result = cli("produce", stream_name, "--raw", stdin="x" * 2000 + "\n")
    assert error_line(result).startswith(
        f"message 0 for stream '{stream_name}' is 2000 bytes, over the stream's "
        f"--max-message-bytes 1024 (`npstream streams update {stream_name} "
        "--max-message-bytes SIZE` raises it); nothing was stored")


def test_create_max_message_bytes_over_the_limit_names_the_flag(cli, stream_name):
    message = error_line(cli("streams", "create", stream_name, "--max-message-bytes", "1TiB"))
    assert message.startswith(f"--max-message-bytes 1099511627776 for stream '{stream_name}' "
                              "must be within 1..")


def test_consume_from_out_of_range_shows_the_range(cli, client, stream_name):
    client.publish_batch(stream_name, [{"value": b"a"}, {"value": b"b"}])
    assert error_line(cli("consume", stream_name, "--from", "9")) == (
        f"offset 9 is out of range for stream '{stream_name}': it holds offsets [0, 2)")


@pytest.mark.parametrize(("flag", "value", "expected"), [
    ("--timeout", "-1", "--timeout must be > 0 seconds, got -1.0"),
    ("--retry-deadline", "-1", "--retry-deadline must be >= 0 seconds, got -1.0"),
])
def test_bad_connection_setting_names_the_flag(cli, flag, value, expected):
    result = cli("streams", "list", flag, value)
    assert (error_line(result), result.returncode) == (expected, 2)


def test_unreachable_broker_names_retry_deadline(cli_at):
    message = error_line(cli_at("127.0.0.1:1", "streams", "list", "--retry-deadline", "0"))
    assert message.endswith("(gave up after 1 attempt(s) over 0s of --retry-deadline)")


def test_missing_token_names_token_flag_and_variable(broker_factory, cli_at, tmp_path):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[[tokens]]\nname = "ops"\ntoken = "s3cret"\nread = ["*"]\n')
    secured = broker_factory(args=["--tokens-file", str(tokens)])
    assert error_line(cli_at(secured.address, "streams", "list")) == (
        "missing or invalid auth token: give one with --token TOKEN or $NPSTREAM_TOKEN")
    with Client(secured.address, "s3cret") as ops:
        assert ops.list_streams() == []


HUGE = "99999999999999999999"  # past the wire's int64


@pytest.mark.parametrize(("args", "code", "named"), [
    (["consume", "{s}", "--from", HUGE], 2, "invalid --from '" + HUGE + "'"),
    (["consume", "{s}", "--from", "²"], 2, "invalid --from '²'"),
    (["consume", "{s}", "--group", "g", "--from", HUGE], 2, "invalid --from"),
    (["groups", "seek", "{s}", "g", "--to", HUGE], 2, "invalid --to"),
    (["groups", "ack", "{s}", "g", HUGE], 2, "argument OFFSETS: invalid offsets"),
    (["groups", "nack", "{s}", "g", "0", "--delay", "100000d"], 1,
     "--delay 8640000000000ms is out of range"),
    (["groups", "receive", "{s}", "g", "--ack-wait", "100000d"], 1,
     "--ack-wait 8640000000000ms is out of range"),
    (["groups", "receive", "{s}", "g", "--max-deliver", "99999999999"], 2,
     "argument --max-deliver: invalid count"),
    (["groups", "receive", "{s}", "g", "--max", "20000"], 1, "--max 20000 is above the maximum"),
    (["groups", "receive", "{s}", "g", "--wait", "inf"], 2, "argument --wait: invalid seconds"),
    (["streams", "truncate", "{s}", "--before", HUGE], 2, "argument --before: invalid offset"),
    (["groups", "redrive", "{s}", "--from", "-1"], 2, "argument --from: invalid offset"),
], ids=lambda value: "-".join(value) if isinstance(value, list) else None)
def test_out_of_range_value_is_one_error_line_naming_the_flag(cli, client, stream_name, args,
                                                              code, named):
    client.publish(stream_name, b"x")
    result = cli(*[arg.format(s=stream_name) for arg in args])
    assert "Traceback" not in result.stderr
    assert result.returncode == code, result.stderr
    assert named in error_line(result)

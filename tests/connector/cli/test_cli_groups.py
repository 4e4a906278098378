"""`npstream groups ...` and `npstream consume --group` end to end against a real broker."""

from __future__ import annotations

import json

from npstream.cli.main import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def offsets(out: str) -> list[int]:
    return [json.loads(line)["offset"] for line in out.splitlines()]


def test_cli_consume_group_and_groups_commands_end_to_end(client, stream_name, broker, capsys):
    client.create_stream(stream_name)
    client.publish_batch(stream_name, [{"value": json.dumps({"n": i})} for i in range(5)])
    b = ("--broker", broker.address)

    code, out, _ = run(capsys, "consume", stream_name, "--group", "cli", "--max", "3", *b)
    assert code == 0
    assert offsets(out) == [0, 1, 2]
    assert json.loads(out.splitlines()[0])["value"] == {"n": 0}
    code, out, _ = run(capsys, "consume", stream_name, "--group", "cli", *b)
    assert (code, offsets(out)) == (0, [3, 4])

    code, out, _ = run(capsys, "groups", "list", stream_name, *b)
    assert code == 0
    header, row = out.splitlines()
    assert header.split()[:4] == ["GROUP", "KIND", "COMMITTED", "LAG"]
    assert row.split()[:4] == ["cli", "cursor", "5", "0"]

    code, out, _ = run(capsys, "groups", "describe", stream_name, "cli", "--json", *b)
    data = json.loads(out)
    assert (code, data["committed_offset"], data["lag"], data["kind"]) == (0, 5, 0, "cursor")
    code, out, _ = run(capsys, "groups", "describe", stream_name, "cli", *b)
    assert "committed offset:  5" in out

    code, out, _ = run(capsys, "groups", "seek", stream_name, "cli", "--to", "1", *b)
    assert code == 0 and "now at offset 1" in out
    code, out, _ = run(capsys, "consume", stream_name, "--group", "cli", "--max", "1", *b)
    assert offsets(out) == [1]
    code, out, _ = run(capsys, "groups", "seek", stream_name, "cli", "--to", "99", *b)
    assert "now at offset 5 (clamped to the stream's end)" in out
    code, out, _ = run(capsys, "groups", "seek", stream_name, "cli", "--to",
                       "2000-01-01T00:00:00Z", *b)
    assert "now at offset 0" in out
    code, out, _ = run(capsys, "groups", "seek", stream_name, "new", "--to", "latest", *b)
    assert "now at offset 5" in out
    code, _, err = run(capsys, "groups", "seek", stream_name, "cli", "--to", "soon", *b)
    assert code == 2 and "invalid --to 'soon'" in err

    code, out, _ = run(capsys, "groups", "delete", stream_name, "cli", *b)
    assert (code, out.strip()) == (0, f"deleted group 'cli' of stream '{stream_name}'")
    code, _, err = run(capsys, "groups", "delete", stream_name, "cli", *b)
    assert code == 1 and "group 'cli' does not exist" in err
    code, _, err = run(capsys, "groups", "describe", stream_name, "cli", *b)
    assert code == 1 and "does not exist" in err


def test_cli_consume_group_from_latest_only_applies_to_new_group(client, stream_name, broker,
                                                                  capsys):
    client.create_stream(stream_name)
    client.publish_batch(stream_name, [{"value": "x"}, {"value": "y"}])
    b = ("--broker", broker.address)
    code, out, _ = run(capsys, "consume", stream_name, "--group", "g", "--from", "latest", *b)
    assert (code, out) == (0, "")
    client.publish(stream_name, "z")
    code, out, _ = run(capsys, "consume", stream_name, "--group", "g", "--from", "earliest", *b)
    assert offsets(out) == [2]
    code, _, err = run(capsys, "consume", stream_name, "--group", "h", "--from", "someday", *b)
    assert code == 2 and "invalid --from 'someday'" in err
    assert [g.group for g in client.list_groups(stream_name)] == ["g"]  # nothing created

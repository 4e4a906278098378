"""`npstream groups receive|ack|nack`: shared groups from the shell (issue 34, item 17).

The installed command against a real broker; what the broker holds is
checked with the SDK (describe_group) after each step.
"""

from __future__ import annotations

import json
import re
import socket

MEMBER = f"{socket.gethostname()}-cli"  # the CLI's default member id


def leases(stdout: str) -> list[tuple[int, str, int]]:
    """(offset, value, attempt) of each printed delivery."""
    rows = [json.loads(line) for line in stdout.splitlines()]
    return [(row["offset"], row["value"], row["attempt"]) for row in rows]


def test_receive_prints_leases_then_ack_and_nack_settle_them_by_offset(cli, client,
                                                                       stream_name):
    client.publish_batch(stream_name, [{"value": v} for v in "abcde"])
    received = cli("groups", "receive", stream_name, "work", "--max", "3")
    assert received.returncode == 0, received.stderr
    assert leases(received.stdout) == [(0, "a", 1), (1, "b", 1), (2, "c", 1)]
    first = json.loads(received.stdout.splitlines()[0])
    assert list(first) == ["offset", "id", "key", "value", "timestamp", "headers", "attempt",
                           "lease_expires"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["lease_expires"])
    assert received.stderr == (
        f"received 3 message(s) from shared group 'work' of '{stream_name}' (offsets 0-2) as "
        f"member '{MEMBER}', leased until {first['lease_expires']}: settle them with "
        f"`npstream groups ack {stream_name} work 0-2 --member {MEMBER}` (or nack)\n")
    info = client.describe_group(stream_name, "work")
    assert (info.kind, info.in_flight, [m.member_id for m in info.members]) == (
        "shared", 3, [MEMBER])

    nacked = cli("groups", "nack", stream_name, "work", "0-1")
    assert (nacked.returncode, nacked.stdout) == (0, (
        f"nacked 2 of 2 message(s) of shared group 'work' of '{stream_name}' (offsets 0-1) "
        f"as member '{MEMBER}'\n"))
    acked = cli("groups", "ack", stream_name, "work", "2")
    assert acked.stdout == (f"acked 1 of 1 message(s) of shared group 'work' of "
                            f"'{stream_name}' (offsets 2) as member '{MEMBER}'\n")

    again = cli("groups", "receive", stream_name, "work", "--max", "10")
    assert sorted(leases(again.stdout)) == [(0, "a", 2), (1, "b", 2), (3, "d", 1), (4, "e", 1)]
    done = cli("groups", "ack", stream_name, "work", "0-1,3", "4")
    assert done.stdout.startswith("acked 4 of 4 message(s)")
    info = client.describe_group(stream_name, "work")
    assert (info.committed_offset, info.lag, info.in_flight) == (5, 0, 0)

    empty = cli("groups", "receive", stream_name, "work")
    assert (empty.returncode, empty.stdout) == (0, "")
    assert empty.stderr == (f"received 0 messages from shared group 'work' of '{stream_name}':"
                            " nothing to deliver now (--wait SECONDS waits for one)\n")


def test_ack_of_settled_offsets_says_how_many_were_not_counted(cli, client, stream_name):
    client.publish_batch(stream_name, [{"value": "x"}] * 2)
    cli("groups", "receive", stream_name, "work", "--max", "1")
    result = cli("groups", "ack", stream_name, "work", "0-1")
    assert (result.returncode, result.stdout) == (0, (
        f"acked 1 of 2 message(s) of shared group 'work' of '{stream_name}' (offsets 0-1) as "
        f"member '{MEMBER}'; 1 not acked: not in flight (already settled, dead-lettered or "
        "never delivered)\n"))


def test_nack_by_another_member_leaves_the_lease_and_names_member_flag(cli, client,
                                                                       stream_name):
    client.publish(stream_name, b"x")
    assert cli("groups", "receive", stream_name, "work", "--member", "alice").returncode == 0
    result = cli("groups", "nack", stream_name, "work", "0", "--member", "bob")
    assert result.returncode == 0
    assert result.stdout.endswith("1 not nacked: not in flight (already settled, dead-lettered "
                                  "or never delivered), or leased to another member than "
                                  "'bob' (--member)\n")
    info = client.describe_group(stream_name, "work")
    assert {m.member_id: m.in_flight for m in info.members}["alice"] == 1  # still alice's
    mine = cli("groups", "nack", stream_name, "work", "0", "--member", "alice")
    assert mine.stdout.startswith("nacked 1 of 1 message(s)")


def test_receive_ack_flag_acks_what_it_printed(cli, client, stream_name):
    client.publish_batch(stream_name, [{"value": v} for v in "ab"])
    result = cli("groups", "receive", stream_name, "work", "--ack")
    assert leases(result.stdout) == [(0, "a", 1), (1, "b", 1)]
    assert result.stderr == (f"received and acked 2 of 2 message(s) from shared group 'work' "
                             f"of '{stream_name}' (offsets 0-1) as member '{MEMBER}'\n")
    info = client.describe_group(stream_name, "work")
    assert (info.committed_offset, info.in_flight) == (2, 0)


def test_receive_keeps_the_settings_the_application_gave_the_group(cli, client, stream_name):
    client.publish_batch(stream_name, [{"value": "x"}] * 3)
    client.receive(stream_name, "work", max=1, max_deliver=3, backoff=[1, 5],
                   dead_letter_stream=f"{stream_name}-dead")
    assert cli("groups", "receive", stream_name, "work", "--max", "1").returncode == 0
    settings = client.describe_group(stream_name, "work").settings
    assert (settings.max_deliver, settings.backoff, settings.dead_letter_stream) == (
        3, [1.0, 5.0], f"{stream_name}-dead")
    changed = cli("groups", "receive", stream_name, "work", "--max-deliver", "5")
    assert changed.returncode == 0, changed.stderr
    assert client.describe_group(stream_name, "work").settings.max_deliver == 5


def test_receive_on_a_cursor_group_names_the_cli_commands(cli, client, stream_name):
    client.publish(stream_name, b"x")
    client.consumer(stream_name, "billing").pull(limit=1)
    result = cli("groups", "receive", stream_name, "billing")
    assert result.returncode == 1
    assert result.stderr == (
        f"npstream: error: group 'billing' on stream '{stream_name}' is a cursor group "
        "(`npstream consume --group`); `npstream groups receive/ack/nack` need a shared group: "
        f"use another group name or delete this one (`npstream groups delete {stream_name} "
        "billing`)\n")


def test_ack_bad_offsets_is_a_usage_error(cli, stream_name):
    result = cli("groups", "ack", stream_name, "work", "7-3")
    assert result.returncode == 2
    assert "invalid offsets '7-3': 7-3 ends before it starts" in result.stderr
    result = cli("groups", "ack", stream_name, "work", "x")
    assert "use OFFSET, FIRST-LAST or a comma list of them (e.g. 5 or 3-7,9)" in result.stderr


def commands(help_text: str) -> dict[str, str]:
    """The COMMAND list of an argparse help: name -> its help (wrapped lines joined)."""
    listed: dict[str, str] = {}
    block = help_text.split("COMMAND\n", 1)[1].split("\n\n", 1)[0]
    for line in block.splitlines():
        match = re.match(r"    (\w+)\s+(.*)", line)
        if match:
            name = match.group(1)
            listed[name] = match.group(2)
        else:
            listed[name] += " " + line.strip()
    return listed


def test_help_names_every_command_of_each_command_group(cli):
    summaries = commands(cli("--help").stdout)
    for group in ("streams", "groups", "cluster"):
        names = commands(cli(group, "--help").stdout)
        assert names, group
        missing = [name for name in names if not re.search(rf"\b{name}\b", summaries[group])]
        assert not missing, (group, summaries[group])
    assert "redrive" in summaries["groups"]

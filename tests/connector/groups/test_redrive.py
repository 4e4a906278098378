"""Dead-letter redrive (client.redrive, `npstream groups redrive`) against a real broker."""

from __future__ import annotations

import json
import time

import pytest

from npstream import Client
from npstream.cli.main import main
from npstream.errors import InvalidArgument
from npstream.groups.redrive import REDRIVE_COUNT_HEADER, REDRIVE_ORIGINAL_ID_HEADER


def dead_letter(client: Client, stream: str, group: str, nacked: list[int],
                count: int = 6) -> str:
    """Publish ``count`` messages, nack ``nacked`` once with max_deliver=1; the DLQ name."""
    client.create_stream(stream, exist_ok=True, dedup_window="10m")
    client.publish_batch(stream, [{"value": f"v{i}", "id": f"id-{i}", "key": f"k{i}",
                                   "headers": {"trace": f"t{i % 2}"}} for i in range(count)])
    batch = client.receive_batch(stream, group, max=count, max_deliver=1)
    batch.nack(nacked)
    batch.ack()
    dlq = f"{stream}.dlq"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if client.list_streams(prefix=dlq) and client.stream_info(dlq).end_offset == len(nacked):
            return dlq
        time.sleep(0.05)
    raise AssertionError("dead letters did not arrive")


def test_redrive_republishes_with_count_and_original_id_and_never_twice(client, stream_name):
    dlq = dead_letter(client, stream_name, "g", [1, 3, 4])
    result = client.redrive(dlq)
    assert (result.moved, result.duplicates, result.skipped) == ({stream_name: 3},
                                                                 {stream_name: 0}, 0)
    back = client.fetch(stream_name, 6)
    assert back.column("value").to_pylist() == [b"v1", b"v3", b"v4"]
    assert back.column("key").to_pylist() == [b"k1", b"k3", b"k4"]
    assert back.column("id").to_pylist() == ["id-1~redrive1", "id-3~redrive1", "id-4~redrive1"]
    headers = [dict(h) for h in back.column("headers").to_pylist()]
    assert [h[REDRIVE_COUNT_HEADER] for h in headers] == [b"1"] * 3
    assert [h[REDRIVE_ORIGINAL_ID_HEADER] for h in headers] == [b"id-1", b"id-3", b"id-4"]
    assert [h["trace"] for h in headers] == [b"t1", b"t1", b"t0"]
    assert not any(k.startswith("npstream-dlq-") for h in headers for k in h)

    again = client.redrive(dlq)  # nothing is stored twice
    assert (again.moved, again.duplicates) == ({stream_name: 0}, {stream_name: 3})
    assert client.stream_info(stream_name).end_offset == 9

    redelivered = client.receive_batch(stream_name, "g", max=10)
    assert redelivered.offsets.tolist() == [6, 7, 8]  # the group sees them again


def test_redrive_by_range_and_by_header(client, stream_name):
    dlq = dead_letter(client, stream_name, "g", [0, 1, 2, 3])
    only_t1 = client.redrive(dlq, header=("trace", "t1"))
    assert (only_t1.moved, only_t1.not_matching) == ({stream_name: 2}, 2)
    ranged = client.redrive(dlq, start=0, end=1)
    assert ranged.moved == {stream_name: 1} and ranged.scanned == (0, 1)
    assert client.fetch(stream_name, 6).column("id").to_pylist() == [
        "id-1~redrive1", "id-3~redrive1", "id-0~redrive1"]
    with pytest.raises(InvalidArgument, match=r"empty or reversed"):
        client.redrive(dlq, start=3, end=1)


def test_a_redriven_message_dead_lettered_again_gets_the_next_count(client, stream_name):
    dlq = dead_letter(client, stream_name, "g", [2], count=3)
    client.redrive(dlq)
    batch = client.receive_batch(stream_name, "g", max=5, max_deliver=1)
    assert batch.offsets.tolist() == [3]
    batch.nack()
    deadline = time.monotonic() + 10
    while client.stream_info(dlq).end_offset < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    second = client.redrive(dlq, start=1)
    assert second.moved == {stream_name: 1}
    (headers,) = client.fetch(stream_name, 4).column("headers").to_pylist()
    assert dict(headers)[REDRIVE_COUNT_HEADER] == b"2"
    assert client.fetch(stream_name, 4).column("id").to_pylist() == ["id-2~redrive2"]


def test_cli_groups_redrive(client, stream_name, broker, capsys):
    dlq = dead_letter(client, stream_name, "g", [5])
    code = main(["groups", "redrive", dlq, "--broker", broker.address])
    out, _ = capsys.readouterr()
    assert code == 0
    assert out.splitlines()[:2] == [
        f"redrive of '{dlq}' [0, 1): 1 message(s) moved",
        f"  {stream_name}: 1 moved, 0 already redriven (duplicates)"]
    code = main(["groups", "redrive", dlq, "--json", "--broker", broker.address])
    out, _ = capsys.readouterr()
    assert json.loads(out)["duplicates"] == {stream_name: 1}
    code = main(["groups", "redrive", dlq, "--header", "oops", "--broker", broker.address])
    _, err = capsys.readouterr()
    assert code == 2 and "invalid --header 'oops': use NAME=VALUE" in err

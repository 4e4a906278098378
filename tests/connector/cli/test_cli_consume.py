"""`npstream consume` past the end of a stream (issue 34, item 18)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("follow", [[], ["--follow"]], ids=["once", "follow"])
def test_consume_from_past_the_end_exits_1_naming_the_range(cli, client, stream_name, follow):
    client.publish_batch(stream_name, [{"value": b"a"}, {"value": b"b"}])
    result = cli("consume", stream_name, "--from", "99", *follow, timeout=30)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith(
        f"npstream: error: offset 99 is out of range for stream '{stream_name}'")
    assert result.stderr.count("\n") == 1


def test_consume_from_the_end_prints_nothing_and_exits_0(cli, client, stream_name):
    client.publish_batch(stream_name, [{"value": b"a"}, {"value": b"b"}])
    result = cli("consume", stream_name, "--from", "2")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")

"""Metrics, the web console and `npstream top` on a cluster of two real brokers (issue 19).

Each member's /metrics says which member it is (npstream_cluster_member_info);
each member's console shows its member address and lists the streams of both
members, each row naming its member, in the JSON API and in a real headless
Chromium; `npstream top` against one member shows every member's streams
with a BROKER column, and after `streams move` the moved stream's new member.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import Browser

from cluster_members import start_members
from harness import BrokerProcess
from npstream import Client
from npstream.broker.cluster.placement import rendezvous_owner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BrokerProcess]]:
    brokers = start_members(tmp_path_factory.mktemp("observe"), ["a", "b"])
    yield brokers
    for broker in brokers:
        broker.stop()


@pytest.fixture(scope="module")
def streams(members: list[BrokerProcess]) -> dict[str, BrokerProcess]:
    """Two streams on each member, with 3 and 5 messages; name -> its member."""
    addresses = [b.address for b in members]
    placed: dict[str, BrokerProcess] = {}
    for broker in members:
        names = [f"obs-{i}" for i in range(200)
                 if rendezvous_owner(f"obs-{i}", addresses) == broker.address][:2]
        for name in names:
            placed[name] = broker
    with Client(members[0].address) as client:
        for index, name in enumerate(sorted(placed)):
            client.publish_batch(name, [{"value": b"v"} for _ in range(3 + 2 * (index % 2))])
    return placed


def get_json(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url, timeout=10).read())


def test_each_members_metrics_name_the_member(members):
    for broker in members:
        samples = broker.metrics()
        key = f'npstream_cluster_member_info{{member="{broker.address}",members="2"}}'
        assert samples[key] == 1.0
        assert samples['npstream_stream_moves_unfinished{state="copying"}'] == 0.0


def test_the_console_api_lists_both_members_streams(members, streams):
    for broker in members:
        overview = get_json(broker.http_address + "/api/overview")
        assert overview["member"] == broker.address
        # Members come from etcd, in its order (by member id), not in start order.
        assert sorted(overview["members"]) == sorted(b.address for b in members)
        listed = get_json(broker.http_address + "/api/streams")
        rows = {row["name"]: row for row in listed["streams"]}
        assert set(rows) == set(streams) and listed["total"] == 4
        assert listed["unavailable_members"] == []
        with Client(broker.address) as client:
            for name, holder in streams.items():
                assert rows[name]["member"] == holder.address
                assert rows[name]["end_offset"] == client.stream_info(name).end_offset


def npstream(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NPSTREAM_BROKER", "NPSTREAM_TOKEN")}
    return subprocess.run([sys.executable, "-m", "npstream.cli", *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False)


def top_brokers(broker: BrokerProcess) -> dict[str, str]:
    done = npstream("top", "--once", "--interval", "0.3", "--no-groups", "--broker",
                    broker.address)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "cluster of 2" in lines[0]
    header = next(i for i, line in enumerate(lines) if line.startswith("STREAM"))
    assert lines[header].split()[-1] == "BROKER"
    return {line.split()[0]: line.split()[-1] for line in lines[header + 1:] if line.strip()}


def test_top_on_one_member_shows_every_members_streams_and_follows_a_move(members, streams):
    shown = top_brokers(members[1])
    assert shown == {name: holder.address for name, holder in streams.items()}
    moved = next(name for name, holder in sorted(streams.items()) if holder is members[0])
    with Client(members[0].address) as client:
        client.move_stream(moved, members[1].address)
    try:
        assert top_brokers(members[0])[moved] == members[1].address
    finally:
        with Client(members[0].address) as client:
            client.move_stream(moved, members[0].address)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    chrome = Browser(tmp_path / "profile")
    yield chrome
    chrome.close()


def test_the_console_page_shows_the_member_and_the_clusters_streams(members, streams, browser,
                                                                     tmp_path):
    broker = members[0]
    browser.goto(broker.http_address + "/#/streams")
    browser.wait_for("document.body.dataset.ready === 'yes' && "
                     "document.querySelectorAll('tr[data-stream]').length === 4", "streams table")
    rows = browser.evaluate("""Object.fromEntries([...document.querySelectorAll('tr[data-stream]')]
        .map(tr => [tr.dataset.stream, Object.fromEntries([...tr.querySelectorAll('td')]
            .map(td => [td.dataset.field, td.innerText.trim()]))]))""")
    for name, holder in streams.items():
        expected = holder.address + (" (this one)" if holder is broker else "")
        assert rows[name]["member"] == expected
    links = browser.evaluate("[...document.querySelectorAll('tr[data-stream] a')]"
                             ".map(a => a.innerText)")
    assert sorted(links) == sorted(n for n, h in streams.items() if h is broker)
    browser.wait_for("document.getElementById('overview').innerText.includes('member')",
                     "the member in the header")
    header = browser.evaluate("document.getElementById('overview').innerText")
    assert f"member {broker.address} of 2" in header
    browser.screenshot(tmp_path / "cluster-streams.png")
    assert not browser.errors()

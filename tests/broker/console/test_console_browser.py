"""The web console in a real headless Chromium, against a running broker with a known workload.

Each page (streams, one stream with its messages and a time seek, groups,
charts) is loaded from the broker's HTTP port, the numbers on the page are
compared with what the broker reports over gRPC, and a screenshot of each is
saved under the test's temporary directory. With auth on, the console asks
for a token and shows only what that token may read. Nothing is loaded from
anywhere but the broker, and the page logs no errors (no CSP violation).

``NPSTREAM_CONSOLE_SCREENSHOT=docs/console-groups.png`` also writes the groups
page's screenshot there (the one in the README).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from browser import Browser

from harness import REPO_ROOT, BrokerProcess, write_tokens_file
from npstream import Client

pytestmark = [pytest.mark.slow]

ENV = {"NPSTREAM_CONSOLE_HISTORY": "30s"}  # a sample every second: charts fill quickly


@pytest.fixture(scope="module")
def console_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("console") / "data", env=ENV).start()
    yield proc
    proc.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    chrome = Browser(tmp_path / "profile")
    yield chrome
    chrome.close()


def cells(browser: Browser, selector: str) -> list[dict[str, str]]:
    """Each matching table row as {data-field: text}."""
    return browser.evaluate(f"""[...document.querySelectorAll({json.dumps(selector)})].map(
        tr => Object.fromEntries([...tr.querySelectorAll('td')].map(
            td => [td.dataset.field, td.innerText.trim()])))""")


def number(text: str) -> int:
    return int(text.replace(",", ""))


ORDERS = 120  # published to orders before the trickle
TRICKLE = 10  # messages per batch of the trickle: one batch per history sample


def history(broker: BrokerProcess) -> dict:
    """The console's /api/history (what the charts page draws)."""
    with urllib.request.urlopen(broker.http_address + "/api/history", timeout=10) as reply:
        return json.load(reply)


@dataclass(frozen=True)
class Batch:
    """One batch of the trickle: the history sample it followed, when it was sent and acked
    (wall clock, as the broker's sample times)."""

    after_sample: float
    sent: float
    acked: float


def interval_batches(trickle: list[Batch], times: list[float], k: int) -> int | None:
    """How many trickle batches the broker's sample ``k`` counted since sample ``k - 1``,
    or None where a batch's ack may fall on either side of a sample.

    A sample reads the end offsets, then takes its time, and the next one reads at least a
    second (the interval) after that: sample ``k``'s read lies in
    [times[k-1] + 1, times[k]]. A batch sent after times[k-1] and acked before
    times[k-1] + 1 is in interval k, one acked before times[k-2] + 1 is in an earlier
    one, one sent after times[k] in a later one.
    """
    # (Only for intervals after the trickle's first sample: it alone publishes to orders then.)
    lo, hi, before = times[k - 1], times[k], times[k - 2] + 1.0
    inside = 0
    for batch in trickle:
        if batch.acked < before or batch.sent > hi:
            continue
        if batch.sent > lo and batch.acked < lo + 1.0:
            inside += 1
        else:
            return None
    return inside


@pytest.fixture(scope="module")
def workload(console_broker: BrokerProcess) -> Iterator[dict[str, object]]:
    """orders: 120 JSON orders (then a trickle: TRICKLE per history sample), cursor group
    billing at 70, shared group shipping with 6 leases out and 1 dead letter; audit: 15
    lines, subscriber indexer."""
    client = Client(console_broker.address)
    orders = [{"order": i, "customer": f"c{i % 7}", "total": round(i * 1.25, 2),
               "items": [{"sku": f"sku-{i % 5}", "qty": 1 + i % 3}]} for i in range(120)]
    for chunk in range(0, 120, 30):
        client.publish_batch("orders", [{"value": json.dumps(o).encode(), "key": o["customer"]}
                                        for o in orders[chunk:chunk + 30]])
        time.sleep(0.3)
    client.publish_batch("audit", [{"value": f"login user-{i}".encode()} for i in range(15)])
    client.consumer("orders", "billing").pull(limit=70)                   # lag 50
    leases = client.receive("orders", "shipping", max=10, ack_wait=600, max_deliver=2)
    for lease in leases[:3]:
        lease.ack()
    leases[3].nack()             # redelivered once, nacked again: dead-lettered; 6 in flight
    client.receive("orders", "shipping", max=1, ack_wait=600, max_deliver=2)[0].nack()
    release = threading.Event()
    subscription = client.subscribe("audit", "indexer", lambda lease: release.wait(120),
                                    max_in_flight=2, ack_wait=600)       # 1 member, 2 leased
    stop = threading.Event()
    trickle: list[Batch] = []

    def publish() -> None:
        """The trickle, so the charts have a rate: one batch of TRICKLE messages right after
        each sample of the console's history (seen on /api/history), so each interval
        between two samples takes exactly one batch however slow the machine is."""
        with Client(console_broker.address) as producer:
            seen = None
            while not stop.is_set():
                last = history(console_broker)["times"][-1]
                if last != seen:
                    seen, start = last, time.time()
                    producer.publish_batch("orders", [{"value": b'{"order": "live"}'}]
                                           * TRICKLE)
                    trickle.append(Batch(seen, start, time.time()))
                stop.wait(0.05)

    producer = threading.Thread(target=publish)
    producer.start()
    try:
        yield {"client": client, "orders": orders, "trickle": trickle}
    finally:
        stop.set()
        producer.join()
        release.set()
        subscription.stop()
        client.close()


def test_streams_page_matches_the_broker(console_broker, workload, browser, tmp_path):
    client: Client = workload["client"]  # type: ignore[assignment]
    browser.goto(console_broker.http_address + "/#/streams")
    browser.wait_for("document.body.dataset.ready === 'yes' && "
                     "document.querySelectorAll('tr[data-stream]').length === 3", "streams table")
    rows = {r["name"]: r for r in cells(browser, "tr[data-stream]")}
    assert set(rows) == {"orders", "audit", "orders.dlq"}
    for name in ("orders", "audit", "orders.dlq"):
        info = client.stream_info(name)
        shown = rows[name]
        assert abs(number(shown["end_offset"]) - info.end_offset) <= 15  # orders keeps growing
        assert number(shown["start_offset"]) == info.start_offset
        assert number(shown["segments"]) == info.segment_count
    assert number(rows["audit"]["end_offset"]) == 15
    assert number(rows["audit"]["message_count"]) == 15
    assert number(rows["orders.dlq"]["end_offset"]) == 1
    browser.wait_for("[...document.querySelectorAll('tr[data-stream=orders] td')]"
                     ".some(td => td.dataset.field === 'rate_in' && parseFloat(td.innerText) > 0)",
                     "a publish rate for orders", timeout=30)
    browser.screenshot(tmp_path / "streams.png")
    assert (tmp_path / "streams.png").stat().st_size > 10_000
    assert "lag" in browser.evaluate("document.getElementById('overview').innerText")


def test_stream_page_shows_config_messages_and_seeks_by_time(console_broker, workload, browser,
                                                             tmp_path):
    client: Client = workload["client"]  # type: ignore[assignment]
    browser.goto(console_broker.http_address + "/#/stream/audit")
    browser.wait_for("document.querySelectorAll('#messages .message').length === 15",
                     "the last messages of audit")
    info = client.stream_info("audit")
    config = browser.evaluate("""Object.fromEntries([...document.querySelectorAll('#config dd')]
        .map(dd => [dd.dataset.field, dd.innerText]))""")
    assert number(config["End offset"]) == info.end_offset == 15
    assert config["Max message"] == "1.0 MiB"
    offsets = browser.evaluate("[...document.querySelectorAll('#messages .message')]"
                               ".map(m => Number(m.dataset.offset))")
    assert offsets == list(range(15))
    assert browser.evaluate("document.querySelector('.message[data-offset=\"3\"] pre')"
                            ".innerText") == "login user-3"

    browser.goto(console_broker.http_address + "/#/stream/orders")
    browser.wait_for("document.getElementById('stream-name')?.innerText === 'Stream orders' && "
                     "document.querySelectorAll('#messages .message').length === 20",
                     "the orders page")
    # pick an order by time: the seek shows the first message at or after it
    stored = client.fetch("orders", offset=40, max_messages=1).to_pylist()[0]
    at = stored["timestamp"].astimezone(UTC)
    expected = client.offset_for_timestamp("orders", at)
    browser.evaluate(f"""(() => {{
        document.getElementById('seek-time').value = {json.dumps(at.isoformat())};
        document.getElementById('seek-limit').value = '10';
        document.getElementById('seek').requestSubmit(); }})()""")
    browser.wait_for(f"document.querySelector('#messages .message')?.dataset.offset === "
                     f"'{expected}' && document.querySelectorAll('#messages .message').length "
                     "=== 10", "the time seek")
    pretty = browser.evaluate(f"document.querySelector('.message[data-offset=\"{expected}\"] pre')"
                              ".innerText")
    assert json.loads(pretty) == workload["orders"][expected]  # type: ignore[index]
    assert '\n  "items": [\n' in pretty  # pretty-printed, two-space indent
    groups = cells(browser, "#stream-groups tr[data-group]")
    assert {g["group"] for g in groups} == {"billing", "shipping"}
    browser.screenshot(tmp_path / "stream.png")


def test_groups_page_matches_the_broker(console_broker, workload, browser, tmp_path):
    client: Client = workload["client"]  # type: ignore[assignment]
    browser.goto(console_broker.http_address + "/#/groups")
    browser.wait_for("document.querySelectorAll('#groups tr[data-group]').length === 3 && "
                     "document.querySelectorAll('#groups tr[data-group]')[0].innerText",
                     "groups table")
    # the indexer's leases arrive asynchronously; wait for both, then compare
    browser.wait_for("[...document.querySelectorAll('#groups tr[data-group=indexer] td')]"
                     ".some(td => td.dataset.field === 'in_flight' && td.innerText === '2')",
                     "indexer's two leases")
    rows = {r["group"]: r for r in cells(browser, "#groups tr[data-group]")}
    shipping = client.describe_group("orders", "shipping")
    assert number(rows["shipping"]["in_flight"]) == shipping.in_flight == 6
    assert number(rows["shipping"]["dead_lettered"]) == shipping.dead_lettered == 1
    assert number(rows["shipping"]["redelivered"]) == 1
    assert number(rows["shipping"]["committed_offset"]) == shipping.committed_offset == 4
    assert rows["shipping"]["dead_letter_stream"] == "orders.dlq"
    billing = client.describe_group("orders", "billing")
    assert number(rows["billing"]["committed_offset"]) == billing.committed_offset == 70
    assert abs(number(rows["billing"]["lag"]) - billing.lag) <= 15  # orders keeps growing
    assert rows["billing"]["kind"] == "cursor"
    indexer = client.describe_group("audit", "indexer")
    assert number(rows["indexer"]["lag"]) == indexer.lag == 15
    assert rows["indexer"]["members_connected"] == "1 / 1"
    members = cells(browser, "table[id^='members-audit'] tr")
    assert [m["connected"] for m in members if m] == ["yes"]
    shot = browser.screenshot(tmp_path / "groups.png")
    target = os.environ.get("NPSTREAM_CONSOLE_SCREENSHOT")
    if target:
        shutil.copyfile(shot, REPO_ROOT / target)


def test_charts_show_publish_rate_and_group_lag(console_broker, workload, browser, tmp_path):
    trickle: list[Batch] = workload["trickle"]  # type: ignore[assignment]
    for _attempt in range(10):
        browser.goto(console_broker.http_address + "/#/charts")
        browser.wait_for("document.querySelector('#rate-chart path[data-series=\"orders\"]') "
                         "&& document.querySelector('#lag-chart path[data-series="
                         "\"orders/billing\"]')", "both charts drawn", timeout=30)
        legend = browser.evaluate("""Object.fromEntries([...document.querySelectorAll(
            '.legend span')].map(s => [s.dataset.series, s.innerText]))""")
        # the x axis ends at the page's last sample, HH:MM:SS (samples are >= 1 s apart)
        last_label = browser.evaluate("[...document.querySelectorAll('#rate-chart text')]"
                                      ".at(-1).textContent")
        times = history(console_broker)["times"]
        k = next(i for i, t in enumerate(times)
                 if datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S UTC") == last_label)
        if (k >= 2 and trickle and times[k - 1] > trickle[0].after_sample
                and interval_batches(trickle, times, k) == 1):
            break
        # the page's last interval is before the trickle, or (a very slow machine) the
        # trickle missed a sample or a batch's ack is on both sides of one: a later page
        time.sleep(2)
    else:
        raise AssertionError(f"no page whose last interval holds one trickle batch: {trickle}")
    # The broker counted exactly the trickle's batch between the page's last two samples.
    expected_rate = TRICKLE / (times[k] - times[k - 1])  # ~10/s: samples ~1 s apart
    rate = float(legend["orders"].split(": ")[1].split()[0])
    assert abs(rate - expected_rate) <= 0.05 + 0.01, (rate, expected_rate)  # shown as 9.9
    # ... and every sample of its lag: all batches sent before sample k were acked before it
    sent_before = sum(1 for b in trickle if b.sent < times[k])
    lag = number(legend["orders/billing"].split(": ")[1].split()[0])
    assert lag == ORDERS + TRICKLE * sent_before - 70
    assert legend["audit/indexer"] == "audit/indexer: 15 messages"
    # The whole window the broker serves: each interval the trickle covered took its batch.
    snapshot = history(console_broker)
    times, rates = snapshot["times"], snapshot["rates"]["orders"]
    checked = 0
    for i in range(2, len(times)):
        if times[i - 1] <= trickle[0].after_sample:
            continue  # the orders before the trickle may be in it
        count = interval_batches(trickle, times, i)
        if count is not None:
            assert abs(rates[i - 1] - count * TRICKLE / (times[i] - times[i - 1])) <= 0.01, (
                i, rates, times, trickle)
            checked += 1
    assert checked >= 1, (times, trickle)  # at least the page's own interval
    browser.screenshot(tmp_path / "charts.png")
    assert browser.errors() == []
    outside = [u for u in browser.requested_urls()
               if not u.startswith(console_broker.http_address) and u != "about:blank"]
    assert outside == []


def test_with_auth_the_console_asks_for_a_token_and_shows_only_readable_streams(
        broker_factory, browser, tmp_path):
    broker = broker_factory("auth-console", args=write_tokens_file(
        tmp_path / "tokens.toml", "console-admin-3e1d", "console-reader-9a0c", "public-*"))
    with Client(broker.address, token="console-admin-3e1d") as admin:
        admin.publish("public-news", b'{"headline": "hello"}')
        admin.publish("private-payroll", b'{"salary": 1}')
        admin.consumer("private-payroll", "hr").pull()
    browser.goto(broker.http_address + "/")
    browser.wait_for("document.body.dataset.page === 'login' && "
                     "!document.getElementById('login').hidden", "the token form")
    browser.screenshot(tmp_path / "login.png")
    browser.evaluate("""(() => { document.getElementById('token').value = 'not-a-token';
        document.getElementById('login').requestSubmit(); })()""")
    browser.wait_for("document.getElementById('login-error').innerText.includes('not accepted')",
                     "a refused token")
    browser.evaluate("""(() => { document.getElementById('token').value = 'console-reader-9a0c';
        document.getElementById('login').requestSubmit(); })()""")
    browser.wait_for("document.body.dataset.page === 'streams' && "
                     "document.querySelectorAll('tr[data-stream]').length > 0", "streams")
    names = browser.evaluate("[...document.querySelectorAll('tr[data-stream]')]"
                             ".map(r => r.dataset.stream)")
    assert names == ["public-news"]
    browser.goto(broker.http_address + "/#/groups")
    browser.wait_for("document.body.dataset.page === 'groups'", "groups page")
    assert browser.evaluate("document.querySelectorAll('#groups tr[data-group]').length") == 0
    browser.goto(broker.http_address + "/#/stream/private-payroll")
    browser.wait_for("document.getElementById('error')", "a refusal")
    assert "no stream 'private-payroll'" in browser.evaluate(
        "document.getElementById('error').innerText")
    assert "salary" not in browser.evaluate("document.body.innerText")
    assert "console-reader-9a0c" not in broker.log_text()


def test_no_token_in_a_url_and_the_api_answers_401_without_one(broker_factory, tmp_path):
    import urllib.error
    import urllib.request

    broker = broker_factory("auth-api", args=write_tokens_file(
        tmp_path / "tokens.toml", "console-admin-3e1d", "console-reader-9a0c", "public-*"))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(broker.http_address + "/api/streams", timeout=10)
    assert refused.value.code == 401
    assert "WWW-Authenticate" not in refused.value.headers  # no browser pop-up
    page = urllib.request.urlopen(broker.http_address + "/", timeout=10)
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert datetime.now(UTC)  # the page itself needs no token

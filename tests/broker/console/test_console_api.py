"""The web console's JSON and files over HTTP (no browser): routes, messages, typed values."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from harness import BrokerProcess
from npstream import Client


def get(broker: BrokerProcess, path: str, method: str = "GET") -> tuple[int, object]:
    request = urllib.request.Request(broker.http_address + path, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            body = reply.read()
            kind = reply.headers["Content-Type"]
            return reply.status, json.loads(body) if "json" in kind else body.decode()
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if body.startswith(b"{") else body.decode()


def test_messages_pages_offsets_times_and_typed_values(broker, client: Client, stream_name):
    client.create_stream(stream_name, schema="sensorId STRING NOT NULL, reading DOUBLE")
    client.publish_batch(stream_name, [{"value": {"sensorId": f"s{i}", "reading": i / 2},
                                        "key": f"k{i}", "headers": {"h": b"\xff\x00"}}
                                       for i in range(30)])
    status, page = get(broker, f"/api/streams/{stream_name}/messages?limit=5")
    assert status == 200
    assert [m["offset"] for m in page["messages"]] == [25, 26, 27, 28, 29]
    last = page["messages"][-1]
    assert last["value"] == {"json": {"sensorId": "s29", "reading": 14.5}}  # typed: JSON
    assert last["key"] == {"text": "k29"}
    assert last["headers"] == {"h": {"base64": "/wA="}}
    _, page = get(broker, f"/api/streams/{stream_name}/messages?limit=3&offset=10")
    assert [m["offset"] for m in page["messages"]] == [10, 11, 12]
    at = client.fetch(stream_name, 0, max_messages=1).to_pylist()[0]["timestamp"]
    _, page = get(broker, f"/api/streams/{stream_name}/messages?limit=2&time="
                          f"{int(at.timestamp() * 1000)}")
    assert page["messages"][0]["offset"] == client.offset_for_timestamp(stream_name, at)
    _, described = get(broker, f"/api/streams/{stream_name}")
    assert described["schemas"][0]["ddl"] == "sensorId STRING NOT NULL, reading DOUBLE"
    assert described["end_offset"] == 30 and described["messages_in"] == 30


def test_errors_and_limits(broker, client: Client, stream_name):
    client.publish(stream_name, b"\xff\xfebin")
    _, page = get(broker, f"/api/streams/{stream_name}/messages")
    assert page["messages"][0]["value"] == {"base64": "//5iaW4="}
    assert get(broker, f"/api/streams/{stream_name}/messages?limit=500")[0] == 400
    assert get(broker, f"/api/streams/{stream_name}/messages?time=yesterday-ish")[0] == 400
    assert get(broker, "/api/streams/no-such-stream")[0] == 404
    assert get(broker, "/api/nothing")[0] == 404
    assert get(broker, "/static/../../etc/passwd")[0] == 404
    assert get(broker, "/api/streams", method="POST")[0] == 405
    status, page = get(broker, "/")
    assert status == 200 and '<script src="/static/console.js" defer>' in str(page)


@pytest.mark.parametrize("setting", ["NPSTREAM_CONSOLE"])
def test_console_off_leaves_metrics(broker_factory, setting):
    broker = broker_factory("noconsole", env={setting: "false"})
    assert "console=off" in broker.log_text()
    assert get(broker, "/")[0] == 404
    assert get(broker, "/api/streams")[0] == 404
    assert "npstream_streams" in broker.metrics()

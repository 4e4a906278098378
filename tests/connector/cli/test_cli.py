"""The `npstream` command end to end: a subprocess against a real broker process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from npstream.client.values import ms_to_iso


def npstream(broker, *args: str, stdin: str | None = None, script: bool = False,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    command = ([shutil.which("npstream", path=str(Path(sys.executable).parent)) or "npstream"]
               if script else [sys.executable, "-m", "npstream.cli"])
    env = {**os.environ, "NPSTREAM_BROKER": broker.address}
    env.pop("NPSTREAM_TOKEN", None)
    return subprocess.run([*command, *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=timeout)


def _expected_lines(client, stream, documents, ids=None):
    table = client.fetch(stream, 0)
    stamps = table.column("timestamp").cast("int64").to_pylist()
    broker_ids = table.column("id").to_pylist()
    return [
        json.dumps({"offset": i, "id": (ids[i] if ids else broker_ids[i]), "key": None,
                    "value": doc, "timestamp": ms_to_iso(stamps[i]), "headers": {}},
                   ensure_ascii=False)
        for i, doc in enumerate(documents)
    ]


def test_produce_file_then_consume_from_earliest_prints_exact_lines(broker, client, stream_name,
                                                                    tmp_path):
    documents = [{"id": f"e{i}", "n": i, "text": "ünï"} for i in range(5)]
    source = tmp_path / "events.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in documents) + "\n")
    produced = npstream(broker, "produce", stream_name, str(source), "--id-field", "id",
                        "--batch-size", "2", script=True)
    assert produced.returncode == 0, produced.stderr
    assert produced.stdout == (f"produced 5 message(s) to '{stream_name}': first offset 0, "
                               "last offset 4, 0 duplicate(s)\n")
    assert produced.stderr == ""  # stderr is not a terminal: no progress bar

    consumed = npstream(broker, "consume", stream_name, "--from", "earliest", "--max", "3")
    assert consumed.returncode == 0, consumed.stderr
    expected = _expected_lines(client, stream_name, documents, ids=[d["id"] for d in documents])
    assert consumed.stdout.splitlines() == expected[:3]


def test_produce_same_ids_again_reports_duplicates(broker, client, stream_name, tmp_path):
    client.create_stream(stream_name, dedup_window="10m")
    source = tmp_path / "a.jsonl"
    source.write_text('{"id": "a"}\n{"id": 7}\n')
    assert npstream(broker, "produce", stream_name, str(source), "--id-field", "id").returncode == 0
    again = npstream(broker, "produce", stream_name, str(source), "--id-field", "id", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"stream": stream_name, "count": 2, "stored": 0,
                                        "duplicates": 2, "first_offset": 0, "last_offset": 1}
    assert client.fetch(stream_name, 0).column("id").to_pylist() == ["a", "7"]


def test_produce_raw_stdin_with_key_free_lines(broker, client, stream_name):
    result = npstream(broker, "produce", stream_name, "--raw", stdin="plain line\n{not json\n")
    assert result.returncode == 0, result.stderr
    values = client.fetch(stream_name, 0).column("value").to_pylist()
    assert values == [b"plain line", b"{not json"]
    consumed = npstream(broker, "consume", stream_name)
    assert [json.loads(line)["value"] for line in consumed.stdout.splitlines()] == [
        "plain line", "{not json"]


def test_produce_invalid_json_line_publishes_lines_before_and_exits_1(broker, client, stream_name,
                                                                       tmp_path):
    source = tmp_path / "bad.jsonl"
    source.write_text('{"a": 1}\n{"a": 2}\n{"a": \n{"a": 4}\n')
    result = npstream(broker, "produce", stream_name, str(source))
    assert result.returncode == 1
    assert result.stdout == (f"produced 2 message(s) to '{stream_name}': first offset 0, "
                             "last offset 1, 0 duplicate(s)\n")
    assert result.stderr.startswith(f"npstream: error: line 3 of {source}: invalid JSON (")
    assert result.stderr.count("\n") == 1
    assert client.fetch(stream_name, 0).column("value").to_pylist() == [b'{"a": 1}', b'{"a": 2}']


def test_produce_key_field_and_consume_shows_key(broker, client, stream_name):
    result = npstream(broker, "produce", stream_name, "--key-field", "user",
                      stdin='{"user": "u1", "v": 1}\n{"v": 2}\n')
    assert result.returncode == 0, result.stderr
    assert client.fetch(stream_name, 0).column("key").to_pylist() == [b"u1", None]


@pytest.mark.slow  # five CLI processes
def test_streams_create_describe_json_list_and_delete(broker, client, stream_name):
    created = npstream(broker, "streams", "create", stream_name, "--max-age", "7d",
                       "--max-bytes", "1GiB", "--dedup-window", "2m",
                       "--max-message-bytes", "1MiB")
    assert created.returncode == 0, created.stderr
    assert f"stream:             {stream_name}" in created.stdout
    client.publish(stream_name, "x")
    described = npstream(broker, "streams", "describe", stream_name, "--json")
    assert described.returncode == 0, described.stderr
    assert json.loads(described.stdout) == client.stream_info(stream_name).to_dict()
    assert json.loads(described.stdout)["config"] == {
        "max_age_ms": 604_800_000, "max_bytes": 1 << 30, "dedup_window_ms": 120_000,
        "max_message_bytes": 1 << 20}
    listed = npstream(broker, "streams", "list", "--prefix", stream_name)
    assert listed.stdout.splitlines()[0].split() == ["NAME", "START", "END", "MESSAGES", "BYTES",
                                                     "LAST", "TIMESTAMP"]
    assert listed.stdout.splitlines()[1].split()[:4] == [stream_name, "0", "1", "1"]
    deleted = npstream(broker, "streams", "delete", stream_name)
    assert (deleted.returncode, deleted.stdout) == (0, f"deleted stream '{stream_name}'\n")
    again = npstream(broker, "streams", "delete", stream_name)
    assert (again.returncode, again.stdout, again.stderr) == (
        1, "", f"npstream: error: stream '{stream_name}' does not exist\n")


def test_streams_truncate_then_consume_below_start_fails_with_range(broker, client, stream_name):
    client.publish_batch(stream_name, [{"value": str(i)} for i in range(6)])
    truncated = npstream(broker, "streams", "truncate", stream_name, "--before", "4")
    assert truncated.returncode == 0, truncated.stderr
    assert truncated.stdout == (f"stream '{stream_name}' now holds offsets [4, 6) "
                                "(2 messages)\n")
    below = npstream(broker, "consume", stream_name, "--from", "1")
    assert below.returncode == 1
    assert below.stderr == (f"npstream: error: offset 1 is out of range for stream "
                            f"'{stream_name}': it holds offsets [4, 6)\n")
    earliest = npstream(broker, "consume", stream_name)
    assert [json.loads(x)["offset"] for x in earliest.stdout.splitlines()] == [4, 5]
    everything = npstream(broker, "streams", "truncate", stream_name, "--all")
    assert everything.stdout == f"stream '{stream_name}' now holds offsets [6, 6) (0 messages)\n"


def test_consume_from_iso_time_and_latest(broker, client, stream_name):
    client.publish(stream_name, "old")
    time.sleep(0.05)
    client.publish(stream_name, "new")
    stamp = client.fetch(stream_name, 1).column("timestamp").cast("int64").to_pylist()[0]
    by_time = npstream(broker, "consume", stream_name, "--from", ms_to_iso(stamp))
    assert [json.loads(x)["value"] for x in by_time.stdout.splitlines()] == ["new"]
    latest = npstream(broker, "consume", stream_name, "--from", "latest")
    assert (latest.returncode, latest.stdout) == (0, "")
    bad = npstream(broker, "consume", stream_name, "--from", "yesterday")
    assert bad.returncode == 2
    assert bad.stderr.startswith("npstream: error: invalid --from 'yesterday': use earliest")


def test_consume_follow_prints_new_messages_and_ctrl_c_exits_130(broker, client, stream_name):
    client.create_stream(stream_name)
    env = {**os.environ, "NPSTREAM_BROKER": broker.address}
    # A suite started in the background by a shell without job control (`make test &`
    # in a script) inherits SIGINT ignored, and so would the CLI, which then cannot be
    # interrupted. A handler is reset to the default on exec, an ignore is not.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "npstream.cli", "consume", stream_name, "--follow"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        time.sleep(1.5)  # let it start and long-poll
        client.publish(stream_name, {"hello": "world"})
        line = proc.stdout.readline()
        assert json.loads(line)["value"] == {"hello": "world"}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_arguments_exit_2_with_one_line(broker):
    # More usage errors are checked in-process in test_cli_args.py.
    result = npstream(broker, "streams", "create", "a/b", script=True)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("npstream: error: argument name: invalid stream name 'a/b'")
    assert result.stderr.count("\n") == 1


def test_broker_command_runs_a_broker_with_the_given_arguments(tmp_path):
    from npstream import Client

    ready = tmp_path / "ready"
    script = shutil.which("npstream", path=str(Path(sys.executable).parent)) or "npstream"
    env = {**os.environ, "NPSTREAM_METRICS_PORT": "0"}
    proc = subprocess.Popen(
        [script, "broker", "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1",
         "--port", "0", "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.read_text().strip()):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "broker did not become ready"
            time.sleep(0.05)
        with Client(ready.read_text().strip()) as client:
            assert client.publish("via-cli", "x").offset == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert (tmp_path / "data" / "streams" / "via-cli").is_dir()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_consume_with_group_resumes_where_the_group_left_off(broker, client, stream_name):
    client.publish_batch(stream_name, [{"value": {"n": i}} for i in range(5)])
    first = npstream(broker, "consume", stream_name, "--group", "audit", "--max", "2")
    assert first.returncode == 0, first.stderr
    second = npstream(broker, "consume", stream_name, "--group", "audit")
    assert second.returncode == 0, second.stderr
    assert [json.loads(x)["offset"] for x in first.stdout.splitlines()] == [0, 1]
    assert [json.loads(x)["value"] for x in second.stdout.splitlines()] == [
        {"n": 2}, {"n": 3}, {"n": 4}]


def test_produce_draws_progress_only_when_stderr_is_a_terminal(broker, stream_name):
    import pty

    controller, terminal = pty.openpty()
    env = {**os.environ, "NPSTREAM_BROKER": broker.address}
    proc = subprocess.Popen([sys.executable, "-m", "npstream.cli", "produce", stream_name],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=terminal,
                            env=env)
    os.close(terminal)
    out, _ = proc.communicate(b'{"a": 1}\n{"a": 2}\n', timeout=60)
    drawn = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # EIO once the process closed its end
            break
        if not chunk:
            break
        drawn += chunk
    os.close(controller)
    assert proc.returncode == 0
    assert out.decode().startswith("produced 2 message(s)")
    assert b"\r2 messages sent (" in drawn
    assert drawn.endswith(b"\r\x1b[K")  # the line is cleared before the summary

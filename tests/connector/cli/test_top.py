"""``npstream top`` in a pseudo-terminal against a real broker: the screen, keys, quitting.

The command runs on the slave side of a pty (a terminal of 160 x 40); the test
reads what it draws from the master side. Each refresh is drawn from the
top-left corner (ESC [ H) down to a clear-to-end (ESC [ J), so the last such
frame is exactly what the screen shows.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from npstream import Client

# The installed console script, as users run it.
NPSTREAM = [str(Path(sys.executable).parent / "npstream")]
FRAME = re.compile(rb"\x1b\[H(.*?)\x1b\[J", re.S)


class PtyProcess:
    """A command on a pty; ``screen()`` is its last complete frame as lines of text."""

    def __init__(self, args: list[str], columns: int = 160, lines: int = 40) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color"}
        env.pop("COLUMNS", None)
        env.pop("LINES", None)
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env,
                                     close_fds=True, start_new_session=True)
        os.close(slave)
        self.master = master
        self.output = b""
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if not ready:
                if self.proc.poll() is not None:
                    return
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the slave side is closed
                return
            if not data:
                return
            with self._lock:
                self.output += data

    def screen(self) -> list[str]:
        with self._lock:
            frames = FRAME.findall(self.output)
        if not frames:
            return []
        text = frames[-1].replace(b"\x1b[K", b"").replace(b"\r", b"").decode()
        return text.split("\n")

    def wait_for(self, check: Callable[[list[str]], bool], what: str,
                 timeout: float = 20.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.screen()
            if lines and check(lines):
                return lines
            assert self.proc.poll() is None, self.output.decode(errors="replace")[-3000:]
            time.sleep(0.05)
        raise AssertionError(f"{what}; screen:\n" + "\n".join(self.screen())
                             + "\nraw tail:\n" + self.output.decode(errors="replace")[-2000:])

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(5)
        os.close(self.master)


@pytest.fixture
def top_factory() -> Iterator[Callable[..., PtyProcess]]:
    started: list[PtyProcess] = []

    def start(*args: str) -> PtyProcess:
        proc = PtyProcess([*NPSTREAM, "top", *args])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


def row(lines: list[str], first: str) -> list[str] | None:
    """The cells of the first line whose first cell is ``first``."""
    for line in lines:
        cells = line.split()
        if cells and cells[0] == first:
            return cells
    return None


def test_top_shows_streams_and_the_lag_of_a_known_workload(broker, client, stream_name,
                                                           top_factory):
    a, b = f"{stream_name}-a", f"{stream_name}-b"
    client.publish_batch(a, [{"value": b"x" * 50}] * 100)
    client.publish_batch(b, [{"value": b"y"}] * 30)
    assert len(client.consumer(a, "billing").pull(limit=40)) == 40       # lag 60
    assert len(client.receive(b, "shipping", max=5, ack_wait=60)) == 5   # 5 in flight, lag 30

    top = top_factory("--broker", broker.address, "--interval", "0.3",
                      "--pattern", f"{stream_name}-*")
    lines = top.wait_for(lambda s: row(s, "billing") is not None and row(s, b) is not None,
                         "the streams and groups never showed")
    assert lines[0].startswith(f"npstream top - {broker.address} - 2 streams, 2 groups")
    assert "sort: in v" in lines[0]
    header = row(lines, "STREAM")
    assert header == ["STREAM", "IN/s", "OUT/s", "END", "OFFSET", "MESSAGES", "SIZE", "GROUPS"]
    assert row(lines, a)[3:5] == ["100", "100"]          # end offset, messages
    assert row(lines, b)[3:5] == ["30", "30"]
    assert row(lines, "billing")[1:4] == [a, "cursor", "60"]       # stream, kind, lag
    shipping = row(lines, "shipping")
    assert shipping[1:4] == [b, "shared", "30"] and shipping[5] == "5"  # in flight

    stop = threading.Event()

    def publish() -> None:
        with Client(broker.address) as producer:
            while not stop.is_set():
                producer.publish_batch(a, [{"value": b"z"}] * 20)
                time.sleep(0.05)

    producer = threading.Thread(target=publish)
    producer.start()
    try:
        lines = top.wait_for(lambda s: row(s, a) is not None and row(s, a)[1] not in ("-", "0.0"),
                             "no publish rate for the busy stream")
        assert float(row(lines, a)[1].replace(",", "")) > 10
        assert lines.index(next(x for x in lines if x.startswith(a))) < lines.index(
            next(x for x in lines if x.startswith(b)))   # sorted by rate in: busy one first
    finally:
        stop.set()
        producer.join()
    end = client.stream_info(a).end_offset
    lines = top.wait_for(lambda s: row(s, a)[3] == f"{end:,}" and row(s, a)[1] == "0.0",
                         "the end offset or the quiet rate never showed")
    assert row(lines, "billing")[3] == f"{end - 40:,}"  # the lag grew with the publishes

    top.type("s")
    top.wait_for(lambda s: "sort: out v" in s[0], "s did not change the sort")
    top.type("r")
    top.wait_for(lambda s: "sort: out ^" in s[0], "r did not reverse the order")
    top.type("g")
    top.wait_for(lambda s: row(s, "GROUP") is None, "g did not hide the groups")
    time.sleep(1.0)  # several refreshes at 0.3 s: the counts come from new samples
    lines = top.screen()
    assert row(lines, "GROUP") is None
    assert lines[0].startswith(f"npstream top - {broker.address} - 2 streams, 2 groups")
    assert row(lines, a)[-1] == "1" and row(lines, b)[-1] == "1"  # the GROUPS column
    top.type("q")
    assert top.proc.wait(10) == 0
    top._reader.join(5)
    assert top.output.endswith(b"\x1b[?25h\x1b[?1049l")  # cursor and screen restored


def test_top_unreachable_broker_shows_the_error_in_the_title_not_over_the_screen(top_factory):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    top = top_factory("--broker", address, "--interval", "0.3", "--retry-deadline", "2")
    lines = top.wait_for(lambda s: "[BrokerUnavailable: broker at" in s[0],
                         "the error never showed in the title")
    assert lines[0].startswith(f"npstream top - {address} - 0 streams, 0 groups")
    top.type("q")
    assert top.proc.wait(10) == 0
    top._reader.join(5)
    assert b"WARNING" not in top.output  # the retry notices stay off the live screen


def top_once(broker, *args: str) -> list[str]:
    """The lines `npstream top` prints with stdout not a terminal (exit 0, no escapes)."""
    result = subprocess.run([*NPSTREAM, "top", "--broker", broker.address, "--interval", "0.2",
                             *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout
    return result.stdout.splitlines()


def test_top_once_prints_one_screen_when_not_on_a_terminal(broker, client, stream_name,
                                                           tmp_path: Path):
    client.publish_batch(stream_name, [{"value": b"x"}] * 7)
    client.consumer(stream_name, "g").pull(limit=2)
    lines = top_once(broker, "--pattern", stream_name, "--sort", "lag")
    assert lines[0].startswith(f"npstream top - {broker.address} - 1 streams, 1 groups")
    assert lines[1] == ""  # no keys line: nothing reads keys here
    assert not any(line.startswith("keys:") for line in lines)
    assert row(lines, stream_name)[3:5] == ["7", "7"]
    assert row(lines, "g")[1:4] == [stream_name, "cursor", "5"]


def test_top_no_groups_reads_no_groups_and_shows_no_counts(broker, client, stream_name):
    client.publish_batch(stream_name, [{"value": b"x"}] * 3)
    client.consumer(stream_name, "g").pull(limit=1)
    lines = top_once(broker, "--pattern", stream_name, "--no-groups", "--once")
    assert lines[0].startswith(f"npstream top - {broker.address} - 1 streams - ")
    assert row(lines, "STREAM") == ["STREAM", "IN/s", "OUT/s", "END", "OFFSET", "MESSAGES",
                                    "SIZE"]
    cells = row(lines, stream_name)
    assert cells[3:5] == ["3", "3"] and len(cells) == 7  # no GROUPS cell after "N B"
    assert row(lines, "GROUP") is None


def test_top_refuses_a_bad_interval(broker):
    result = subprocess.run([*NPSTREAM, "top", "--broker", broker.address, "--interval", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--interval must be > 0" in result.stderr

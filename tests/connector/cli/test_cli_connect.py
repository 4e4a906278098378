"""Connecting: a broker that is down, an address that is wrong (issue 34, item 15)."""

from __future__ import annotations

import itertools
import os
import re
import socket
import subprocess
import time

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_command_unreachable_broker_says_what_it_retries_while_it_waits(npstream_path):
    address = f"127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if k not in ("NPSTREAM_BROKER", "NPSTREAM_TOKEN")}
    proc = subprocess.Popen([npstream_path, "streams", "list", "--broker", address,
                             "--retry-deadline", "3"], stderr=subprocess.PIPE, text=True, env=env)
    lines: list[tuple[str, bool]] = []  # (line, the command was still running when it came)
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append((line.rstrip("\n"), proc.poll() is None))
    assert proc.wait(30) == 1
    notice = re.compile(
        rf"npstream: WARNING: broker at {re.escape(address)} is unavailable "
        r"\(StreamService\.ListStreams, attempt (\d+), (\d+\.\d)s of 3s\): next attempt in "
        r"(\d+\.\d)s: failed to connect to all addresses")
    *notices, (error, _) = lines
    assert error.startswith(f"npstream: error: broker at {address} is unavailable: ")
    assert error.endswith("over 3s of --retry-deadline)")
    assert len(notices) >= 2, lines
    found = [notice.match(line) for line, _ in notices]
    assert all(found), notices
    assert all(running for _, running in notices)  # said while waiting, not at the end
    attempts = [int(m.group(1)) for m in found if m]
    elapsed = [float(m.group(2)) for m in found if m]
    assert attempts == sorted(set(attempts)) and attempts[0] > 1
    assert 1.0 <= elapsed[0] < 2.0   # the first after a second, then once a second at most
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(elapsed))
    assert all(float(m.group(3)) <= 1.0 for m in found if m)  # the backoff's cap


@pytest.mark.parametrize("how", ["flag", "env"])
def test_command_broker_without_port_is_refused_at_once(cli_at, how):
    started = time.monotonic()
    if how == "flag":
        result = cli_at("127.0.0.1:1", "streams", "list", "--broker", "localhost")
    else:
        result = cli_at("localhost", "streams", "list")
    assert time.monotonic() - started < 10  # not the 15 s retry deadline
    assert result.returncode == 2
    assert result.stderr == (
        "npstream: error: invalid --broker address 'localhost' (or $NPSTREAM_BROKER): no port; "
        "use host:port (e.g. localhost:7070, [::1]:7070) or a gRPC target (dns:///host:7070, "
        "unix:/path/to.sock)\n")

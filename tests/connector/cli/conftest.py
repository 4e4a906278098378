"""The installed ``npstream`` command, run as a user runs it, against a real broker process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# The console script pip installed next to this interpreter (the worktree's .venv/bin/npstream).
NPSTREAM = str(Path(sys.executable).parent / "npstream")

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]


def run_npstream(address: str, *args: str, stdin: str | None = None,
                 token: str | None = None, timeout: float = 60,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``npstream ARGS`` with NPSTREAM_BROKER=address (and NPSTREAM_TOKEN=token, if given)."""
    full_env = {**os.environ, "NPSTREAM_BROKER": address, **(env or {})}
    full_env.pop("NPSTREAM_TOKEN", None)
    if token is not None:
        full_env["NPSTREAM_TOKEN"] = token
    return subprocess.run([NPSTREAM, *args], input=stdin, capture_output=True, text=True,
                          env=full_env, timeout=timeout)


@pytest.fixture
def npstream_path() -> str:
    """Path of the installed console script (for tests that drive the process themselves)."""
    return NPSTREAM


@pytest.fixture
def cli_at() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``cli_at(address, *args, stdin=None, token=None, env=None)``: any broker address."""
    return run_npstream


@pytest.fixture
def cli(broker: object) -> RunCli:
    """``cli(*args, stdin=None, token=None)``: the installed command against the module's broker."""

    def run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return run_npstream(broker.address, *args, **kwargs)  # type: ignore[attr-defined,arg-type]

    return run

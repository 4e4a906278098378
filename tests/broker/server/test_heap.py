"""The broker's heap tuning (npstream.broker.server.heap) and its config key."""

from __future__ import annotations

import ctypes.util
import sys

import pytest

from npstream.broker.server.config import load_config
from npstream.broker.server.heap import retain_freed_memory


def test_retain_freed_memory_default_and_env_override():
    assert load_config(None, env={}).server.retain_freed_memory == 256 << 20
    config = load_config(None, env={"NPSTREAM_RETAIN_FREED_MEMORY": "0"})
    assert config.server.retain_freed_memory == 0


def test_retain_freed_memory_zero_keeps_allocator_defaults():
    assert retain_freed_memory(0) is False


@pytest.mark.skipif(not sys.platform.startswith("linux") or not ctypes.util.find_library("c"),
                    reason="glibc mallopt is Linux-only")
def test_retain_freed_memory_applies_with_glibc():
    # Above glibc's 32 MiB mmap-threshold maximum: the threshold is capped, not refused.
    assert retain_freed_memory(1 << 30) is True

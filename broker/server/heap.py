"""Keeping freed heap memory in the broker process instead of handing it back to the kernel.

Every ~4 MiB publish request passes through a few buffers of its size (the
received message, the decoded request, the stored frame). With glibc's
defaults such blocks are mmap'ed and unmapped, or trimmed off the heap, for
every request, so the next request pays page faults for all of them again
(keeping them roughly halves the broker's kernel CPU time while publishing small
messages: docs/benchmarks.md). ``retain_freed_memory`` raises glibc's mmap threshold to
its maximum (32 MiB on 64-bit) and its trim threshold to the configured
amount, so freed request buffers are reused. The cost is resident memory: up
to that amount of freed heap stays mapped after a burst.

It also caps glibc's arenas at ``MALLOC_ARENAS`` (glibc's default is 8 per
CPU). Each arena keeps its own freed blocks, and the broker's many threads
(64 RPC workers plus gRPC's own) spread large request buffers over all of
them, so after a burst of publishes each arena holds its own peak; fewer arenas
keep less at the same publish throughput (the broker's Python threads take
turns under the GIL, and it runs on one CPU by default, so arenas barely
contend; docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from typing import Any, NamedTuple

from npstream.broker.server.tuning import MALLOC_ARENAS

__all__ = ["HeapUsage", "heap_usage", "retain_freed_memory"]

log = logging.getLogger(__name__)

# mallopt parameter numbers (glibc malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# glibc refuses mmap thresholds above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024


@functools.cache
def _mallopt() -> Any:
    """glibc's mallopt, or None (another libc)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return None
    if mallopt is not None:
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        mallopt.restype = ctypes.c_int
    return mallopt


def retain_freed_memory(limit_bytes: int) -> bool:
    """Let the heap keep up to ``limit_bytes`` freed; False when not applied (0, or no glibc).

    Caps the arenas at MALLOC_ARENAS first, whatever the limit (module docstring):
    called before the broker starts its threads, so they all share those.
    """
    mallopt = _mallopt()
    if mallopt is not None and not mallopt(_M_ARENA_MAX, MALLOC_ARENAS):
        log.warning("mallopt refused M_ARENA_MAX=%d; glibc keeps its default arenas",
                    MALLOC_ARENAS)
    if limit_bytes <= 0:
        return False
    if mallopt is None:
        log.info("retain_freed_memory: no glibc mallopt here; using the allocator's defaults")
        return False
    mmap_threshold = min(limit_bytes, _MMAP_THRESHOLD_MAX)
    trim_threshold = min(limit_bytes, 2**31 - 1)
    applied = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    if applied:
        log.debug("heap keeps up to %d bytes freed (mmap threshold %d)", trim_threshold,
                  mmap_threshold)
    else:
        log.warning("retain_freed_memory: mallopt refused %d bytes; using glibc's defaults",
                    limit_bytes)
    return applied


class HeapUsage(NamedTuple):
    """glibc's heap as mallinfo2 sees it: bytes handed out, and freed bytes it keeps."""

    used_bytes: int
    free_bytes: int


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


@functools.cache
def _mallinfo2() -> Any:
    name = ctypes.util.find_library("c")
    try:
        function = ctypes.CDLL(name).mallinfo2 if name else None
    except (OSError, AttributeError):  # no glibc, or one older than 2.33
        return None
    if function is not None:
        function.restype = _MallInfo2
        function.argtypes = ()
    return function


def heap_usage() -> HeapUsage | None:
    """The heap now (None without glibc's mallinfo2): the metrics' memory budget gauges.

    ``free_bytes`` is what ``retain_freed_memory`` lets the heap keep: freed
    chunks not returned to the kernel. ``used_bytes`` counts allocated chunks
    and mmap'ed blocks.
    """
    function = _mallinfo2()
    if function is None:
        return None
    info = function()
    return HeapUsage(int(info.uordblks) + int(info.hblkhd), int(info.fordblks))

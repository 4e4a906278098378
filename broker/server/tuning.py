"""Tuning constants of the broker process, in one place, each with what its value trades."""

from __future__ import annotations

# glibc malloc arenas the broker's threads share (server/heap.py). Each arena keeps
# its own freed request buffers, so more arenas hold more freed heap after a burst of
# publishes; fewer make threads contend for one, which the GIL makes rare.
MALLOC_ARENAS = 2
# Calls gRPC core holds until the Python server takes them (one at a time, on its
# serving thread). Past this many core cancels waiting calls unserved; a higher value
# costs only the memory of calls that wait for their turn (each request is read later,
# by its worker).
MAX_PENDING_CALLS = 65_536

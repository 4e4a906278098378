"""Tuning constants of access control, in one place, each with what its value trades."""

from __future__ import annotations

# How often the tokens file's stat (inode, size, mtime) is compared with the loaded
# one: a change takes effect within this long (SIGHUP at once). Lower: edits apply
# sooner, at one stat call more per interval.
POLL_INTERVAL_S = 1.0
# Decisions remembered per token entry, (right, stream) -> allowed; cleared when full.
# Higher: a client over many streams matches globs less often, at more memory per entry.
DECISION_CACHE_MAX = 4096

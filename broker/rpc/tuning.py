"""Tuning constants of the RPC edge, in one place, each with what its value trades."""

from __future__ import annotations

# ---------------------------------------------------------------- publish budget (budget.py)
# How long a unary publish waits for room before it is refused: long enough to
# ride out the write of the requests ahead of it (a few ms each), short enough
# that a refused client is told quickly and the worker thread is freed.
UNARY_WAIT_S = 0.1
# The delay a refused client is asked to wait before sending again: about the
# time the broker needs to write a few requests' worth of the budget.
RETRY_AFTER_MS = 100
# A waiting PublishStream request re-checks for shutdown and a vanished client
# this often (lower: noticed sooner, at more wake-ups per waiting stream).
STREAM_POLL_S = 0.25
# Calls admitted but not read yet (queued for a worker thread, or being
# received) are not in the byte count: their size is unknown until read. One
# may be as large as a client's request (the SDK sends about 4 MiB), so their
# number is capped at one per this many bytes of budget, and never below
# MIN_UNREAD_CALLS, so that small publishes from many clients are not refused
# while the broker is far from its budget.
UNREAD_CALL_BYTES = 4 << 20
MIN_UNREAD_CALLS = 8
# An admitted call that has not started after this long was cancelled before
# a worker thread took it (gRPC never runs it): it no longer counts as unread.
# Shorter: a slot lost to a cancelled call returns sooner, but a call merely slow to
# be read may stop counting and let more in than the budget means to.
UNREAD_TTL_S = 10.0

"""Tuning constants of the streams package, in one place, each with what its value trades."""

from __future__ import annotations

# ---------------------------------------------------------------- reads
# A long poll (Fetch) looks at its log this often (a log closed under it); data
# arriving, the call's end and the broker's stop wake it at once, so this costs no
# latency. Lower: a closed log is noticed sooner, but every parked poll wakes more
# often and publishes wait behind those wake-ups for the GIL.
LONG_POLL_SLICE_S = 2.0
# How often PublishStream's replying thread re-checks that the client is still there
# and the broker is not stopping while it waits for the next written request (lower:
# noticed sooner, at more wake-ups per open stream).
POLL_INTERVAL_S = 0.25
# Rows per stored read of ReadRange; max_bytes is the real bound per reply. Higher
# only matters for tiny rows: more of them per read, in one larger buffer.
READ_RANGE_MAX_MESSAGES = 100_000

# ---------------------------------------------------------------- registry and listing
# Registry locks per name, a fixed set picked by hash (one per stream would cost memory
# per stream forever). More: fewer unrelated streams share a lock, at a lock object each.
OPEN_LOCKS = 1024
# Names read from SQLite per query while a listing filters them (glob, read right).
# Higher: fewer queries for a sparse match, more names held at once.
LIST_CHUNK = 2000
# Listing-stats rows buffered before they are written in one transaction. Higher:
# fewer transactions, more rows lost to a crash (they are rebuilt from the logs).
FLUSH_ROWS = 1000
# Expired nursery streams written out per retention pass. Higher: fewer passes to
# clear a backlog, a longer metadata transaction each.
EXPIRY_BATCH = 2000

# ---------------------------------------------------------------- start-up checks
# Orphaned directories or short logs named one per line at start; beyond this, one
# line counts the rest (more: a fuller log, flooded on a badly damaged data_dir).
MAX_LINES_PER_KIND = 100
# Frames of the metadata WAL checked at start, before the database opens (~0.3 ms each
# in Python): the default autocheckpoint keeps the WAL near 1,000 pages. Higher: a
# longer WAL is checked whole, at a slower start.
MAX_WAL_FRAMES_CHECKED = 2048

# ---------------------------------------------------------------- disk full
# The disk reserve (disk_reserve.py): room a deletion or config change may write in
# when the disk is full (a start-offset file, a roll's index files and empty segment,
# a few SQLite pages: ~100x less). Larger: more such writes fit, more of the disk held
# back; it is only made while twice its size is free.
RESERVE_BYTES = 1 << 20

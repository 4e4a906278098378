"""Tuning constants of the storage engine, in one place, each with what its value trades.

The ``[storage]`` keys of broker.toml are ``StorageSettings`` (settings.py); these are
the values no operator sets. The figures behind some of them are in
docs/benchmarks.md ("Figures behind the code's choices").
"""

from __future__ import annotations

# ---------------------------------------------------------------- reads
# Smallest pread issued when walking frames for a fetch: small fetches of small
# batches cost one system call, not one per frame header. Larger reads more bytes
# than a small fetch needs.
MIN_READ_BYTES = 64 * 1024
# Frames of at least this many bytes are read by a fetch one pread each (the frame and
# the next header), and a fetch's first pread is at most this long; smaller frames are
# read read_size bytes at a time. Higher: reading ahead copies parts of large frames
# that a byte limit then leaves unread; lower: more preads for mid-sized frames.
LARGE_FRAME_BYTES = 256 * 1024
# Read size when a whole segment is scanned (recovery, index rebuild, repair): large
# enough that the per-call overhead vanishes next to the CRC work, small enough not to
# hold a large buffer per scanning thread.
SCAN_CHUNK_BYTES = 4 * 1024 * 1024
# Bytes per read() of LogReader.read_table: bounds the buffer it holds, and larger
# reads are no faster.
READ_TABLE_BYTES = 8 << 20
# Segments up to this size are peeked at for a stream's stats without opening its log;
# larger ones open the log (it keeps indexes for them). Higher: more bytes scanned per
# peek.
PEEK_MAX_BYTES = 1 << 20

# ---------------------------------------------------------------- appends
# A written batch up to this size stays in memory with the view it made
# (LogView.recent) until the next write, so tail readers take it from there, not from
# the file. Higher: more tail reads served from memory, at up to this much held per
# stream written to.
RECENT_MAX_BYTES = 1 << 20
# Up to this many rows a stored batch is built from Python values; above it the
# columnar builder is cheaper (its cost hardly grows with the row count).
SMALL_BATCH_MAX_ROWS = 16
# Lone-message templates: one per value length up to LONE_TEMPLATE_MAX_BYTES (larger
# values cost their copies anyway), at most LONE_TEMPLATES lengths (oldest dropped
# first), shared by all streams: at most 64 x ~4.5 KiB. More: more message sizes
# appended without building a batch, at that memory.
LONE_TEMPLATE_MAX_BYTES = 4096
LONE_TEMPLATES = 64
# Null columns up to this length are cached and reused by the batch builder; longer
# ones are made per batch (a larger cache holds more memory for rare huge batches).
CACHED_NULLS_MAX_LENGTH = 1 << 16

# ---------------------------------------------------------------- direct writes
# Write buffers kept for reuse between calls (Stage requests of several tasks run at
# once), and the largest kept: a bigger file gets a buffer of its own. More or larger:
# fewer fresh buffers (page faults), more memory held while idle.
KEEP_BUFFERS = 4
KEEP_MAX_BYTES = 64 << 20
# Buffers are sized in steps of this many bytes, so that files of similar sizes reuse
# one (a larger step wastes more of a buffer on a small file).
BUFFER_STEP = 1 << 20
# Kept blocks of created files (WrittenBlocks), oldest forgotten first: ~6 blocks per
# staged file, so thousands of files' worth. Higher: more files stamped without
# re-reading their edges, at this much memory.
KEEP_BLOCKS_MAX_BYTES = 16 << 20
# Files stamped at once by stamp_all (each waits on the disk most of the time). More:
# more overlapping disk waits, at a thread each and more competing I/O.
STAMP_THREADS = 4

# ---------------------------------------------------------------- many streams
# Name locks: a fixed set shared by all names (a lock per name would cost memory per
# stream forever). More: fewer unrelated streams share a lock, at a lock object each.
NAME_LOCKS = 1024
# Stream directories a retention pass looks at when they are not open: idle streams
# are covered in slices, one directory listing spread over many passes, not a full
# walk every retention_check_interval. Higher: idle streams are checked sooner, at a
# longer pass.
IDLE_RETENTION_BATCH = 2000

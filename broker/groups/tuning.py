"""Tuning constants of consumer groups, in one place, each with the reason for its value."""

from __future__ import annotations

# ---------------------------------------------------------------- persistence
# The position writer thread looks for positions nobody woke it for (queued by a
# caller that then did not wait for them) at least this often. Lower: such
# positions reach disk sooner, at more wake-ups of an idle thread.
WRITER_IDLE_LOOK_S = 1.0
# Group positions (committed offsets, dead-letter counts) are written to SQLite
# by one background thread, many groups' changes per transaction. RPCs that
# report a position (Ack, Pull with auto-commit, Commit, Seek) wait for the
# write that covers them; it starts at once, and changes made meanwhile join
# the next one. Changes nobody waits for (acks on Subscribe streams) wait this
# long for company, so a busy subscription costs at most ~200 commits/s.
POSITION_FLUSH_INTERVAL_S = 0.005
# How long an RPC waits for its position write before answering anyway (the
# write is retried; the answer then says nothing about durability).
POSITION_WAIT_TIMEOUT_S = 10.0

# ---------------------------------------------------------------- shared groups
# Default lease length (ack_wait) when a request leaves it at 0. Longer: a crashed
# consumer's messages wait longer for redelivery; shorter: slow consumers see theirs redelivered.
DEFAULT_ACK_WAIT_MS = 30_000
# Default number of deliveries per Receive when max_messages is 0 (more: fewer calls,
# more messages leased to one member at once).
DEFAULT_RECEIVE_MAX = 10
# Upper bound of one Receive (and of one Subscribe credit grant taken at once): higher
# allows larger replies, each held in broker memory while it is sent.
MAX_RECEIVE_MAX = 10_000
# ... and of the bytes of their rows (at least one message): one Receive reply, one
# Subscribe batch. Higher: a subscriber that grants credits but reads nothing holds
# more broker memory per call (counted in messages alone, 10,000 messages of 100 KB
# make a 1 GB reply); lower: large messages go out in more, smaller batches. A
# Subscribe call that does not read holds about one batch: gRPC's send of the last one
# blocks the call before it leases more. 8 MiB: the default fetch size; batches of
# small messages are cut by count.
LEASE_MAX_BYTES = 8 << 20
# Most messages and bytes read from the log per refill of a shared group's
# delivery buffer. The buffer keeps the stored Arrow batches and turns rows into
# Python objects only as they are handed out, so one read serves many
# Receives/Subscribe batches and a large stored batch is read a few times, not
# once per Receive. It costs at most FRESH_READ_BYTES of memory per group with
# undelivered messages read or messages in flight (the last read is kept for
# their redeliveries, log_rows.FreshRows.kept; dropped on seek and retention,
# and when nothing is in flight). A read cut at a
# row count re-encodes the stored batch it cuts, so the row limit is high and
# the byte limit is what ends a read (at a batch boundary).
FRESH_READ_CHUNK = 65_536  # rows: large enough that reads end at whole stored batches
FRESH_READ_BYTES = 16 << 20
# At most this many delivered-but-unfinished messages (leased, waiting for a
# redelivery or for the dead-letter write) per group. Past it, only
# redeliveries are handed out (JetStream's MaxAckPending, on by default here).
# In-flight state is kept as offset spans, not rows (leases.py): a batch of
# 1,000 leased together costs about one span (~300 bytes), so a million in
# flight cost the broker a few tens of bytes each when consumed in batches; the
# worst case, every message leased and settled alone, is one span per message
# (~300 bytes each, ~300 MB at the cap).
MAX_PENDING_PER_GROUP = 1_000_000
# At most this many offsets between the committed offset (lowest not acked)
# and the next fresh offset. Finished offsets above the committed one cost
# nothing (they are simply outside every span), so this only bounds how far a
# group runs ahead of one message that stays unacked.
MAX_ACK_WINDOW = 10_000_000
# Background pass over shared groups: expires leases (so expired messages
# reach the dead-letter stream even when nobody receives), forgets idle
# members, and follows retention. Receives do the same work on demand.
TICK_INTERVAL_S = 1.0
# A member that disconnected (or stopped calling Receive) with no leases is
# listed for this long after it was last seen, then forgotten (longer: listings
# keep departed members around; shorter: a member between calls may drop out of them).
MEMBER_IDLE_MS = 60_000
# Long polls (Pull, Receive, Subscribe) re-check that the client is still
# there and that the broker is not stopping at least this often (and at once
# when woken by data). Lower: a departed client or a stop is noticed sooner, but
# every check of a waiting Receive takes its group's lock, so many waiting polls
# cost the broker CPU in proportion (docs/benchmarks.md).
LONG_POLL_SLICE_S = 2.0
# How long a Subscribe call blocks for work before re-checking that the
# client is still there and its credits (lower: noticed sooner, more wake-ups).
SUBSCRIBE_POLL_S = 1.0
# A SubscribeBatches batch goes out as Arrow (when the client asked for it) from
# this many deliveries on; smaller ones as protobuf Deliveries. Encoding and
# reading an Arrow IPC stream costs ~0.1-0.3 ms whatever its size, protobuf
# ~2.5 us per delivery: a lone message would pay that on its latency.
ARROW_DELIVERIES_MIN_ROWS = 100
# Redeliveries due together whose offsets all lie within this many offsets are read
# with one read of the range covering them (log_rows.read_spans): a read returns
# whole stored batches, and with ordering="key" held messages come back one offset
# at a time, each read alone out of a stored batch of thousands (~16 us a message).
SPAN_GROUP_OFFSETS = 65_536
# A delivery table of more parts than this goes out as one batch (a copy of its
# rows): one IPC message per part, each with its own metadata, was most of the
# cost of ~1,000 one-row parts (ordering="key" redelivering held messages).
COMBINE_PARTS_ABOVE = 16
# With ordering="key", parts of at most this many rows keep their busy offsets as
# dict entries, not as a block (key_order.py): a block's numpy mask costs a few
# microseconds to make and match, a dict entry well under one (a member following
# the tail gets one message at a time).
KEY_ORDER_SINGLES_UP_TO = 4
# With ordering="key", a fresh part whose delivered rows fall in more runs than this
# (held rows cut it) is handed out as one filtered copy, not as a slice per run: each
# part costs the delivery table an Arrow batch of its own (key_order.plan).
KEY_ORDER_SLICES_UP_TO = 4
# When writing to the dead-letter stream fails, retry after this long (lower: a
# recovered stream gets its copies sooner; a failing one is retried more often).
DEAD_LETTER_RETRY_MS = 5_000

# ---------------------------------------------------------------- cursor groups
# Default Pull limit when the request leaves it at 0, and the largest allowed (a
# larger Pull is one larger reply held in memory while it is sent).
DEFAULT_PULL_LIMIT = 100
MAX_PULL_LIMIT = 100_000

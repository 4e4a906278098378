"""Tuning constants of the cluster, in one place, each with what its value trades."""

from __future__ import annotations

# ---------------------------------------------------------------- routing
# Threads that wait for other members' replies at once (each call to a member holds
# one while it waits; a fan-out to N-1 members uses N-1). More: wider fan-outs at
# once, at a thread each.
PEER_THREADS = 16
# How long a holder learnt from another member is trusted without asking again.
# Longer: fewer Owners calls, but a stream that moved is looked for at its old
# member (which redirects) for longer.
HOLDER_TTL_S = 10.0
# Holders remembered at most (least recently used ones forgotten first): more costs
# memory, fewer costs Owners calls for streams beyond it.
HOLDER_CACHE_MAX = 100_000
# Names one Owners call may ask about (a sink task asks for its targets): larger
# calls are refused; higher allows bigger requests and replies held in memory.
MAX_OWNERS_NAMES = 10_000

# ---------------------------------------------------------------- etcd
# How long a stream's etcd owner record, once read, is trusted without reading it
# again. Longer: fewer etcd reads, but a stream that moved is looked for at its old
# member (which redirects) for longer. Names without a record are never cached.
RECORD_TTL_S = 5.0
# Records remembered at most (least recently used ones forgotten first).
RECORD_CACHE_MAX = 100_000
# Records written per etcd transaction when many streams are created at once
# (etcd refuses transactions of more than 128 operations by default).
RECORD_CREATE_BATCH = 64
# How often a stream created here while etcd was out of reach is recorded again.
RECORD_RETRY_S = 1.0

# ---------------------------------------------------------------- stream moves
# Bytes of a file sent in one MoveIn call: larger means fewer calls and more memory
# per call on both members.
CHUNK_BYTES = 1 << 20
# How long a pause waits for the stream's running calls (a long poll ends sooner: its
# group is closed; a Fetch long poll runs out by its wait). Longer: slow calls finish
# rather than fail the move, while the stream's clients are told to wait meanwhile.
PAUSE_WAIT_S = 30.0
# How long a move waits for sink batches staged into the stream to commit (step 0,
# drain); Stage calls into it are refused meanwhile. Longer: fewer moves refused for
# staged rows, a longer refusal of Stage calls.
DRAIN_WAIT_S = 5.0
# How often the drain looks at the staging area again (lower: ends sooner, more looks).
DRAIN_POLL_S = 0.05
# How often unfinished moves are tried again (a target that was down): lower retries
# sooner, at a call to a member that may still be down.
RESUME_INTERVAL_S = 2.0
# Per MoveIn call (a chunk, an install): a slower call fails the step, which is
# retried; higher tolerates slower disks and links, and notices a hung member later.
STEP_TIMEOUT_S = 60.0
# How long a client is asked to wait before sending a paused call again: lower makes
# clients retry sooner after the pause ends, at more refused calls during it.
MOVE_RETRY_AFTER_MS = 200

# ---------------------------------------------------------------- etcd
# Default timeout of one etcd call: longer rides out a slow etcd, shorter reports an
# unreachable one (EtcdUnavailable) sooner.
ETCD_TIMEOUT_S = 5.0
# A watch or keep-alive that lost its stream waits this long before opening another
# (lower: resumes sooner, at more reconnects against an etcd that is down).
ETCD_RECONNECT_DELAY_S = 0.5
# How often a broker that lost its registration tries to register again (lower:
# back in the cluster sooner, at more etcd calls while it cannot).
REREGISTER_INTERVAL_S = 1.0

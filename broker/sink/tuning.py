"""Tuning constants of the sink, in one place, each with what its value trades."""

from __future__ import annotations

# ---------------------------------------------------------------- staging
# Frames per staging file are cut at this many bytes when the caller names no limit
# (the broker passes its max_batch_bytes). Larger: fewer, larger stored batches and
# more memory per frame while staging.
DEFAULT_MAX_FRAME_BYTES = 8 << 20
# Staged chunks smaller than this are grouped (one copy) into one frame; bigger ones
# become stored batches without a copy. Higher: fewer, larger frames at the cost of
# copying more rows; lower: tiny frames that cost readers a header and a batch each.
MIN_PART_BYTES = 256 << 10

# ---------------------------------------------------------------- staging sweep
# The sweep runs this fraction of sink_staging_ttl apart, so staging lives at most
# (1 + fraction) x the TTL. Lower: abandoned staging is freed closer to its TTL, at
# more sweeps (each lists the staging area).
SWEEP_TTL_FRACTION = 0.25
# Bounds of the sweep interval: never more often than the minimum (a short TTL in
# tests would otherwise spin), never less often than the maximum (a sweep also
# deletes staging left behind by committed batches, which waits until then).
SWEEP_MIN_INTERVAL_S = 0.2
SWEEP_MAX_INTERVAL_S = 60.0
# A stage-inbox file nobody wrote to for this long belongs to a task that is gone and
# is deleted. Shorter: its disk space returns sooner, but a task that stalls that long
# between writes loses its file.
IDLE_FILE_S = 600.0

"""The Kafka listener's tuning constants, each with what its value trades."""

from __future__ import annotations

__all__ = ["FETCH_WAIT_SLICE_S", "MAX_FRAME_BYTES"]

# Largest request frame accepted: a bigger size prefix closes the connection before
# anything is read. Kafka's socket.request.max.bytes default (100 MiB): a client's
# largest Produce fits; a hostile prefix cannot make the broker hold more than this.
MAX_FRAME_BYTES = 100 * 1024 * 1024
# A Fetch waiting for min_bytes looks again at least this often even without an
# append (a deleted or moved stream, the broker stopping); appends wake it at once.
FETCH_WAIT_SLICE_S = 1.0

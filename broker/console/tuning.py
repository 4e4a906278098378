"""Tuning constants of the web console, in one place, each with what its value trades."""

from __future__ import annotations

# Messages per page when the request names no limit, and the most it may ask for.
# Higher: fewer clicks through a stream, larger pages for the broker to read and render.
DEFAULT_MESSAGES = 20
MAX_MESSAGES = 200
# Bytes read for one page of messages (bounds the memory a page of large messages takes).
MAX_MESSAGE_BYTES = 4 << 20
# Streams listed at once (the page says when there are more). Higher: longer pages,
# each describing more streams per request.
MAX_STREAMS = 1000
# Samples kept per series of the console's history, whatever the window: the interval
# grows with it, from at least MIN_INTERVAL_S. More points: finer charts, more memory
# and JSON per series.
POINTS = 180
MIN_INTERVAL_S = 1.0

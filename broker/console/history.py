"""The last minutes of each stream's end offset and each group's lag, for the console's charts.

A sampler thread records, every ``interval_s``, the end offset of every open
stream and the lag of every group (at most ``max_series`` of each, the
metrics caps), in ring buffers of ``points`` samples. Rates are differences
of end offsets between samples, so the publish path does no extra work. The
console asks for the whole window at once (``snapshot``) and draws it.

Memory: points x (streams + groups) small numbers; with the default 15
minutes at 5 s and 1000 series each, under 4 MB.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from npstream.broker.console.tuning import MIN_INTERVAL_S, POINTS

__all__ = ["History", "Sample"]

log = logging.getLogger(__name__)



@dataclass
class Sample:
    """What the sampler reads each time: {stream: end offset}, {stream: messages read
    since start}, {(stream, group): lag}."""

    streams: dict[str, int] = field(default_factory=dict)
    outs: dict[str, int] = field(default_factory=dict)
    groups: dict[tuple[str, str], int] = field(default_factory=dict)


class History:
    """Ring buffers of samples, filled by a daemon thread; thread-safe."""

    def __init__(self, read: Callable[[], Sample], window_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._read = read
        self.interval_s = max(MIN_INTERVAL_S, window_s / POINTS)
        self.points = max(2, int(window_s / self.interval_s) + 1)
        self._clock = clock
        self._lock = threading.Lock()
        self._times: deque[float] = deque(maxlen=self.points)
        self._samples: deque[Sample] = deque(maxlen=self.points)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> History:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="console-history", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # the charts may miss a point; the broker must not care
                log.exception("console history sample failed")

    def sample(self) -> None:
        """Take one sample now."""
        sample = self._read()
        with self._lock:
            self._times.append(self._clock())
            self._samples.append(sample)

    def snapshot(self, readable: Callable[[str], bool]) -> dict[str, object]:
        """The window as JSON-ready series: times, publish rates and group lags.

        ``rates[stream][i]`` is the publish rate (messages/s) between sample
        i and i+1 (one value fewer than ``times``), None where the stream was
        not open at both ends or went backwards (deleted and re-created);
        ``lags["stream/group"][i]`` the group's lag at sample i, None where
        the group did not exist.
        """
        with self._lock:
            times = list(self._times)
            samples = list(self._samples)
        names = sorted({n for s in samples for n in s.streams if readable(n)})
        rates: dict[str, list[float | None]] = {}
        for name in names:
            series: list[float | None] = []
            for i in range(1, len(samples)):
                before = samples[i - 1].streams.get(name)
                after = samples[i].streams.get(name)
                dt = times[i] - times[i - 1]
                if before is None or after is None or after < before or dt <= 0:
                    series.append(None)
                else:
                    series.append(round((after - before) / dt, 3))
            rates[name] = series
        keys = sorted({k for s in samples for k in s.groups if readable(k[0])})
        lags = {f"{stream}/{group}": [s.groups.get((stream, group)) for s in samples]
                for stream, group in keys}
        return {"interval_s": self.interval_s, "times": [round(t, 3) for t in times],
                "rates": rates, "lags": lags}

    def recent_rate(self, stream: str, which: str = "in",
                    span_s: float = 30.0) -> float | None:
        """Messages/s into (``in``: publishes) or out of (``out``: reads) ``stream`` over the
        last ``span_s`` seconds of samples; None while unknown."""
        with self._lock:
            found = [(t, (s.streams if which == "in" else s.outs).get(stream))
                     for t, s in zip(self._times, self._samples, strict=True)]
        pairs = [(t, v) for t, v in found if v is not None]
        if len(pairs) < 2:
            return None
        last_t, last_v = pairs[-1]
        first_t, first_v = next(((t, v) for t, v in pairs if last_t - t <= span_s + 1e-6),
                                pairs[-2])
        if (first_t, first_v) == (last_t, last_v):
            first_t, first_v = pairs[-2]
        if last_t <= first_t or last_v < first_v:
            return None
        return (last_v - first_v) / (last_t - first_t)

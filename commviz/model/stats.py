"""Per-op statistics: counts, bytes and latency percentiles in bounded memory."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence

# Exact percentiles up to this many samples per row, then uniform reservoir sampling,
# so memory stays bounded over hours of events.
RESERVOIR = 65536
# Upper bounds (ns) of the latency buckets every timed instance is counted in, exactly
# (Prometheus' histogram, `commviz_op_duration_seconds`): 10 µs to a minute, 1-2.5-5 a
# decade, as collectives span (a small gloo all_reduce ~10 µs, a straggler's seconds);
# one more bucket past the last (+Inf).
BUCKETS_NS = tuple(int(m * 10 ** e) for e in range(4, 10) for m in (1, 2.5, 5)) + (10 ** 10, 3 * 10 ** 10, 6 * 10 ** 10)


class OpStats:
    __slots__ = ("count", "bytes", "errors", "time_ns", "timed", "timed_bytes", "_samples", "_rng", "hist")

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0
        self.errors = 0
        self.time_ns = 0  # sum of durations of timed, successful ops
        self.timed = 0
        self.timed_bytes = 0
        self._samples: list[int] = []
        self._rng = random.Random(0)
        self.hist = [0] * (len(BUCKETS_NS) + 1)  # timed instances per bucket (BUCKETS_NS; the last: above them)

    def copy(self) -> OpStats:
        """An independent copy (its own samples), to fold more instances into."""
        c = OpStats()
        c.count, c.bytes, c.errors = self.count, self.bytes, self.errors
        c.time_ns, c.timed, c.timed_bytes = self.time_ns, self.timed, self.timed_bytes
        c._samples = list(self._samples)
        c.hist = list(self.hist)
        return c

    def add(self, nbytes: int, duration_ns: int | None, error: bool = False) -> None:
        self.count += 1
        self.bytes += nbytes
        if error:
            self.errors += 1
            return
        if duration_ns is None or duration_ns < 0:
            return
        self.time_ns += duration_ns
        self.timed += 1
        self.timed_bytes += nbytes
        self.hist[bisect.bisect_left(BUCKETS_NS, duration_ns)] += 1
        if len(self._samples) < RESERVOIR:
            self._samples.append(duration_ns)
        else:
            j = self._rng.randrange(self.timed)
            if j < RESERVOIR:
                self._samples[j] = duration_ns

    def percentile_us(self, q: float) -> float:
        """Nearest-rank percentile in microseconds (0.0 when nothing was timed)."""
        if not self._samples:
            return 0.0
        s = sorted(self._samples)
        k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
        return s[k] / 1e3

    def percentiles_ns(self, qs: Sequence[float]) -> tuple[int, ...]:
        """Nearest-rank percentiles (0-100) in ns, one sort for all of them (0 when
        nothing was timed): the same samples and rule as `percentile_us`."""
        if not self._samples:
            return tuple(0 for _ in qs)
        s = sorted(self._samples)
        n = len(s)
        return tuple(s[max(0, min(n - 1, math.ceil(q / 100.0 * n) - 1))] for q in qs)

    def algbw_gbps(self) -> float:
        """Bytes of timed ops over their total time: a time-weighted mean of S/t."""
        if not self.time_ns or not self.timed:
            return 0.0
        return self.timed_bytes / self.time_ns  # bytes per ns == GB/s (1e9 B/s)

"""Cumulative counters → rates, per key (e.g. ``gpu0.nvlink3.tx``).

NVML's NVLink and PCIe counters are cumulative with a per-value timestamp, so a rate
is Δvalue/Δt between two readings, using NVML's timestamps rather than our wall clock
(the driver refreshes values on its own schedule). A counter that goes backwards
wrapped or was reset (driver reload, GPU reset). When the counter's modulus is known
(NVML says a field's width by its value type; nvml.h: the PCIe byte counters "can be
wrapped") and it went from the top half of its range to the bottom, it wrapped: the
interval is unwrapped. Otherwise it was reset and the interval is skipped rather than
reported as a huge or negative rate. A reading that is not available forgets the key,
so the next good reading starts afresh instead of spanning the gap.
"""

from __future__ import annotations


class RateTracker:
    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int]] = {}  # key -> (value, t_us)
        self._rate: dict[str, float] = {}

    def update(self, key: str, value: int | float | None, t_us: int | None, scale: float = 1.0,
               modulus: int | None = None) -> float | None:
        """Units of ``value`` per second × ``scale`` since the previous reading of ``key``.

        None on the first reading, after an unavailable one, and across a reset/wrap.
        A reading with the same timestamp as the previous one (NVML had not refreshed)
        repeats the last rate.
        """
        if value is None or t_us is None:
            self._last.pop(key, None)
            self._rate.pop(key, None)
            return None
        prev = self._last.get(key)
        if prev is None:
            self._last[key] = (value, t_us)
            return None
        pv, pt = prev
        dt = t_us - pt
        if dt == 0 and value == pv:
            return self._rate.get(key)
        self._last[key] = (value, t_us)
        dv = value - pv
        if dv < 0 and modulus and pv >= modulus // 2 and value < modulus // 2:
            dv += modulus  # wrapped once
        if dt <= 0 or dv < 0:
            self._rate.pop(key, None)
            return None
        rate = dv * scale * 1e6 / dt
        self._rate[key] = rate
        return rate

    def forget(self, key: str) -> None:
        self._last.pop(key, None)
        self._rate.pop(key, None)

    def __contains__(self, key: str) -> bool:
        return key in self._last

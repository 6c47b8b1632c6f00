"""Short, fixed-width-friendly renderings of numbers for tables (no Textual here).
Bytes and bandwidth read as everywhere else (commviz/units.py)."""

from __future__ import annotations

from commviz.units import format_bps, format_bytes

__all__ = ["format_bps", "format_bytes", "format_count", "format_gbps", "format_rate", "format_seconds", "format_us"]

def format_seconds(s: float | None) -> str:
    """Durations for 'in op' / 'last seen': 0ms, 850ms, 3.2s, 42s, 2m05s, 1h02m."""
    if s is None:
        return "–"
    if s < 0:
        s = 0.0
    if s < 1:
        return f"{int(s * 1000)}ms"
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{int(s)}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def _three_digits(x: float, steps: tuple[tuple[float, str], ...], last: str) -> str:
    """About three significant digits: the format of the first step whose bound `x`
    is under, else `last`; '–' for nothing."""
    if x <= 0:
        return "–"
    for bound, fmt in steps:
        if x < bound:
            return format(x, fmt)
    return format(x, last)


def format_us(us: float) -> str:
    """Latency in microseconds."""
    return _three_digits(us, ((10, ".2f"), (100, ".1f")), ",.0f")


def format_gbps(g: float) -> str:
    return _three_digits(g, ((1, ".3f"), (100, ".2f")), ".0f")


def format_count(n: int) -> str:
    return f"{n:,}"


def format_rate(gbps: float) -> str:
    """A rate given in GB/s, in the unit that reads best."""
    return format_bps(gbps * 1e9)

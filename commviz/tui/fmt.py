"""Short, fixed-width-friendly renderings of numbers for tables (no Textual here)."""

from __future__ import annotations

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: float) -> str:
    """Binary units, one decimal: 0 B, 512 B, 4.0 KiB, 1.2 GiB."""
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{int(n)} B"
    for unit in _UNITS:
        n /= 1024.0
        # Round first so 1023.96 KiB shows as 1.0 MiB rather than "1024.0 KiB".
        if round(n, 1) < 1024 or unit == _UNITS[-1]:
            return f"{sign}{n:.1f} {unit}"
    raise AssertionError("unreachable")


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


def format_us(us: float) -> str:
    """Latency in microseconds with about three significant digits."""
    if us <= 0:
        return "–"
    if us < 10:
        return f"{us:.2f}"
    if us < 100:
        return f"{us:.1f}"
    return f"{us:,.0f}"


def format_gbps(g: float) -> str:
    if g <= 0:
        return "–"
    if g < 1:
        return f"{g:.3f}"
    if g < 100:
        return f"{g:.2f}"
    return f"{g:.0f}"


def format_count(n: int) -> str:
    return f"{n:,}"


def format_bps(bps: float) -> str:
    """Bytes per second in decimal units (GB/s = 1e9 B/s, as bandwidths are quoted)."""
    if bps <= 0:
        return "0 B/s"
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= scale:
            v = bps / scale
            return f"{v:.0f} {unit}" if v >= 100 else f"{v:.1f} {unit}" if v >= 10 else f"{v:.2f} {unit}"
    return f"{bps:.0f} B/s"


def format_rate(gbps: float) -> str:
    """A rate given in GB/s, in the unit that reads best."""
    return format_bps(gbps * 1e9)

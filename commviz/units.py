"""How numbers read, everywhere they are printed: the summary, the dashboard, the
lessons. Bytes in binary units (KiB, MiB: what tensors and buffers are sized in);
bandwidth in decimal units (GB/s = 1e9 bytes per second, as bandwidths are quoted)."""

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


def format_bps(bps: float) -> str:
    """Bytes per second in decimal units, about three significant digits."""
    if bps <= 0:
        return "0 B/s"
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= scale:
            v = bps / scale
            return f"{v:.0f} {unit}" if v >= 100 else f"{v:.1f} {unit}" if v >= 10 else f"{v:.2f} {unit}"
    return f"{bps:.0f} B/s"

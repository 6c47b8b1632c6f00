"""Throughput over time: sparklines of wire GB/s and ops/s, for all ranks and for the
focused rank (its sent and received GB/s and its ops/s). One column per 250 ms."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from commviz.tui.fmt import format_rate

BARS = "▁▂▃▄▅▆▇█"
LABEL_W = 9
VALUE_W = 11


def sparkline(values: list[float], width: int) -> str:
    """The last `width` values as bars scaled to their peak; zero is a blank."""
    if width <= 0:
        return ""
    vals = values[-width:]
    peak = max(vals, default=0.0)
    out = []
    for v in vals:
        if v <= 0 or peak <= 0:
            out.append(" ")
        else:
            out.append(BARS[min(len(BARS) - 1, int((len(BARS) - 1) * v / peak + 0.5))])
    return " " * (width - len(vals)) + "".join(out)


class ThroughputPanel(Static):
    """Two lines for all ranks (GB/s, ops/s), three more for a focused rank."""

    DEFAULT_CSS = """
    ThroughputPanel { height: auto; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._rows: list[tuple[str, list[float], str, str]] = []

    def update_series(self, total: dict, rate: tuple[float, float], focus: int | None = None,
                      focus_series: dict | None = None, focus_rate: tuple[float, float] | None = None) -> None:
        rows = [
            ("GB/s", total["gbps"], format_rate(rate[0]), "tp-bytes"),
            ("ops/s", total["ops"], f"{rate[1]:,.0f}", "tp-ops"),
        ]
        if focus is not None and focus_series is not None:
            fr = focus_rate or (0.0, 0.0)
            rows += [
                (f"r{focus} tx", focus_series["gbps"], format_rate(fr[0]), "tp-focus"),
                (f"r{focus} rx", focus_series["rx_gbps"], format_rate(focus_series["rx_gbps"][-1] if focus_series["rx_gbps"] else 0.0), "tp-focus"),
                (f"r{focus} ops", focus_series["ops"], f"{fr[1]:,.0f}", "tp-focus"),
            ]
        relayout = len(rows) != len(self._rows)
        self._rows = rows
        self._relayout = relayout
        self.border_title = "Throughput" + (f" · all ranks, rank {focus}" if focus is not None else " · all ranks")
        self._paint()

    def on_resize(self) -> None:
        self._paint()

    def _paint(self) -> None:
        width = max(4, self.content_region.width or self.size.width or 40)
        spark_w = max(1, width - LABEL_W - VALUE_W)
        t = Text(no_wrap=True, overflow="crop")
        theme = self.app.theme_variables if self.is_mounted else {}
        colour = {"tp-bytes": theme.get("primary", "cyan"), "tp-ops": theme.get("accent", "magenta"),
                  "tp-focus": theme.get("success", "green")}
        for i, (label, series, value, kind) in enumerate(self._rows):
            if i:
                t.append("\n")
            t.append(label.ljust(LABEL_W)[:LABEL_W], style="bold")
            t.append(sparkline(series, spark_w), style=colour.get(kind, ""))
            t.append(value.rjust(VALUE_W), style="bold")
        self.update(t, layout=getattr(self, "_relayout", True))
        self._relayout = False

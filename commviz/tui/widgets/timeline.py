"""The replay timeline under the flow view: the whole trace as a bar, the part played
heavy, the job's marks (◆) and where each diagnosis began (✖) on it, the playhead (●);
under it the time and the last mark or diagnosis the playhead passed. A click seeks
there (`Seek`); the app's keys `,` `.` jump from tick to tick, `n` `b` step op by op.

`timeline_text` is the pure rendering (tests); the widget only keeps the timeline and
the position and repaints when the position moves a cell.
"""

from __future__ import annotations

from rich.text import Text
from textual.message import Message
from textual.widgets import Static

from commviz.model.timeline import Timeline
from commviz.tui.fmt import format_seconds

HINT = "click: seek · , . marks · n b step"


def timeline_text(tl: Timeline, now: int, width: int) -> Text:
    """Two rows, `width` cells each: the bar with its ticks and playhead, then the time
    and what the playhead last passed."""
    width = max(8, width)
    last = width - 1

    def col(t: int) -> int:
        return round(tl.fraction(t) * last)

    head = col(now)
    cells = [("━", "played") if i <= head else ("─", "rest") for i in range(width)]
    for tick in tl.ticks:  # diagnoses after marks at the same time: they win the cell
        cells[col(tick.t)] = ("✖", "diagnosis") if tick.kind is not None else ("◆", "mark")
    cells[head] = ("●", "head")
    t = Text(no_wrap=True, overflow="crop")
    for ch, style in cells:
        t.append(ch, style=_STYLES[style])
    t.append("\n")
    span = tl.end - tl.start
    where = f"{format_seconds(max(0, now - tl.start) / 1e9)} / {format_seconds(span / 1e9)}"
    line = Text(where, style="bold", no_wrap=True, overflow="crop")
    passed = tl.last_passed(now)
    room = width - len(where) - len(HINT) - 4
    if passed is not None and room > 8:
        label = passed.text if len(passed.text) <= room else passed.text[: room - 1] + "…"
        line.append("  ")
        line.append(label, style=_STYLES["diagnosis" if passed.kind is not None else "mark"])
    gap = width - line.cell_len - len(HINT)
    if gap >= 2:
        line.append(" " * gap)
        line.append(HINT, style="dim")
    t.append_text(line)
    return t


_STYLES = {"played": "bold cyan", "rest": "dim", "mark": "yellow", "diagnosis": "bold red", "head": "bold"}


class TimelineBar(Static):
    """The replay's timeline (hidden on a live feed)."""

    DEFAULT_CSS = """
    TimelineBar { height: 2; padding: 0 1; }
    """

    class Seek(Message):
        """The user clicked the timeline at `fraction` (0..1) of the trace."""

        def __init__(self, fraction: float) -> None:
            super().__init__()
            self.fraction = fraction

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.timeline: Timeline | None = None
        self.now = 0
        self._drawn: tuple | None = None

    def show(self, timeline: Timeline | None, now: int) -> None:
        self.timeline, self.now = timeline, now
        self._paint()

    def on_resize(self) -> None:
        self._drawn = None
        self._paint()

    def _paint(self) -> None:
        if self.timeline is None:
            return
        width = self.content_region.width or self.size.width or 40
        key = (width, self.now, id(self.timeline.ticks))  # the diagnoses arrive later, as a new list
        if key == self._drawn:
            return
        self._drawn = key
        self.update(timeline_text(self.timeline, self.now, width), layout=False)

    def on_click(self, event) -> None:
        off = event.get_content_offset(self)
        width = self.content_region.width
        if off is None or self.timeline is None or width < 2:
            return
        self.post_message(self.Seek(min(1.0, max(0.0, off.x / (width - 1)))))

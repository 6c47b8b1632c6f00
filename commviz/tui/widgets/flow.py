"""The flow view: ranks as nodes, edges carrying traffic, packets moving along them.
What it draws comes with each snapshot as `view.flow.FlowData` (plain data, built
where the model is); the layout on the character grid and the drawing are here.

A line-API widget (`render_line(y) -> Strip`). What does not move — boxes, bars, edge
lines, node labels — is drawn on a `Canvas` once per data update (a few times a
second) and its rows are kept as Strips; each animation frame only computes where the
packets (and blinking hung nodes, pulsing grid cells) are and repaints the rows that
hold one now or held one in the last frame.

Packets move in the direction of the transfer: ▸◂▾▴ for exact bytes (send/recv), the
hollow ▹◃▿▵ for modelled ones (collectives, see `commviz.model.flows`). Their spacing
follows the edge's bytes/s relative to the busiest edge in view, their colour its
absolute rate (below 1 MB/s, 100 MB/s, 10 GB/s, and above). The animation clock is
`t_anim` (seconds): `advance(dt)` moves it, tests set it and call `freeze()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from commviz.model.diagnosis import RankStatus
from commviz.model.flows import HUB
from commviz.tui.widgets.layout import DOWN, LEFT, RIGHT, UP, Canvas, Layout, NodeSpec, line_glyphs, make_layout
from commviz.view.flow import FlowData

CELLS_PER_S = 8.0  # packet speed

# Node glyphs by status; "missing" is a rank others wait for in a diagnosis.
GLYPH = {RankStatus.OK: "●", RankStatus.WAITING: "◐", RankStatus.HUNG: "◐", RankStatus.MISSING: "?",
         RankStatus.DEAD: "✕", RankStatus.EXITED: "○"}
# Worst first, for cells that hold several ranks.
SEVERITY = [RankStatus.DEAD, RankStatus.MISSING, RankStatus.HUNG, RankStatus.WAITING, RankStatus.OK, RankStatus.EXITED]
ALARMING = (RankStatus.MISSING, RankStatus.DEAD, RankStatus.HUNG)  # drawn blinking
PACKET = {False: {RIGHT: "▸", LEFT: "◂", DOWN: "▾", UP: "▴"}, True: {RIGHT: "▹", LEFT: "◃", DOWN: "▿", UP: "▵"}}
SPIN = "◐◓◑◒"
RATE_STEPS = (1e6, 1e8, 1e10)  # B/s: colour levels 1..4 above/below these
RATE_TEXT = ("<1MB/s", "<100MB/s", "<10GB/s", "≥10GB/s")


def rate_level(bps: float) -> int:
    """1..4 by absolute bytes/s."""
    for i, step in enumerate(RATE_STEPS):
        if bps < step:
            return i + 1
    return 4


def spacing_for(bps: float, peak: float) -> int:
    """Cells between packets: the busiest edge in view is densest."""
    if peak <= 0:
        return 8
    r = bps / peak
    if r > 0.6:
        return 2
    if r > 0.3:
        return 3
    if r > 0.1:
        return 4
    if r > 0.01:
        return 6
    return 9


@dataclass
class _Stream:
    cells: list[tuple[int, int, str]]  # (x, y, glyph)
    spacing: int
    style: str


class FlowView(Widget, can_focus=True):
    """Ranks, edges and moving packets. Post `FlowView.RankClicked` on a click on a node."""

    COMPONENT_CLASSES = {
        "flow--line", "flow--line-active", "flow--line-dim", "flow--box", "flow--title", "flow--fabric",
        "flow--label", "flow--legend", "flow--banner", "flow--banner-alert",
        "flow--node-ok", "flow--node-waiting", "flow--node-hung", "flow--node-missing", "flow--node-dead",
        "flow--node-exited", "flow--node-busy", "flow--focus", "flow--peer",
        "flow--pkt-1", "flow--pkt-2", "flow--pkt-3", "flow--pkt-4",
    }

    SCOPED_CSS = False  # every rule names FlowView; the light-mode ones start at the App
    DEFAULT_CSS = """
    FlowView { height: 1fr; min-height: 6; }
    FlowView > .flow--line { color: $text-muted 40%; }
    FlowView > .flow--line-dim { color: $text-muted 20%; }
    FlowView > .flow--line-active { color: $text-muted; }
    FlowView > .flow--box { color: $primary-darken-1; }
    FlowView > .flow--title { color: $text; text-style: bold; }
    FlowView > .flow--fabric { color: $secondary-lighten-1; }
    FlowView > .flow--label { color: $text-muted; }
    FlowView > .flow--legend { color: $text-muted; }
    FlowView > .flow--banner { color: $text; }
    FlowView > .flow--banner-alert { color: $text; background: $error 70%; text-style: bold; }
    FlowView > .flow--node-ok { color: $success; }
    FlowView > .flow--node-busy { color: $success; text-style: bold; }
    FlowView > .flow--node-waiting { color: $warning; }
    FlowView > .flow--node-hung { color: $error; text-style: bold; }
    FlowView > .flow--node-missing { color: $text; background: $error; text-style: bold; }
    FlowView > .flow--node-dead { color: $text; background: $error-darken-2; text-style: bold; }
    FlowView > .flow--node-exited { color: $text-disabled; }
    FlowView > .flow--focus { text-style: bold reverse; }
    FlowView > .flow--peer { text-style: bold underline; }
    FlowView > .flow--pkt-1 { color: #6c8fb3; }
    FlowView > .flow--pkt-2 { color: #00c8f0; text-style: bold; }
    FlowView > .flow--pkt-3 { color: #c466ff; text-style: bold; }
    FlowView > .flow--pkt-4 { color: #ffffff; text-style: bold; }
    .-light-mode FlowView > .flow--pkt-1 { color: #4a6a8a; }
    .-light-mode FlowView > .flow--pkt-2 { color: #00708a; }
    .-light-mode FlowView > .flow--pkt-3 { color: #8000b0; }
    .-light-mode FlowView > .flow--pkt-4 { color: #000000; }
    """

    class RankClicked(Message):
        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.data = FlowData(nodes=[])
        self.focus_rank: int | None = None
        self.t_anim = 0.0
        self.frozen = False  # the animation clock stands still (tests, pause)
        self.flow_layout: Layout | None = None
        self._layout_key: tuple | None = None
        self._canvas: Canvas | None = None
        self._strips: dict[int, Strip] = {}
        self._styles: dict[str, Style] = {}
        self._streams: list[_Stream] = []
        self._blink: list[tuple[int, int, str, str]] = []  # (x, y, text, style) shown on odd half-seconds
        self._spin: list[tuple[int, int, float, str]] = []  # grid cells: (x, y, turns per s, style)
        self._overlay: dict[int, dict[int, tuple[str, str]]] = {}
        self._dirty_static = True
        self.frames = 0  # full repaints, for bench/render.py
        self.lines_rendered = 0

    # ------------------------------------------------------------- feeding

    def update_data(self, data: FlowData, focus: int | None = None) -> None:
        """A new snapshot: rebuild the static layer and the packet streams."""
        self.data = data
        self.focus_rank = focus
        self._dirty_static = True
        if self.size.width and self.size.height:
            self._build()
        self.refresh()

    def freeze(self, t_anim: float | None = None) -> None:
        """Stop the animation clock (at `t_anim` if given): for tests and the pause key."""
        if t_anim is not None:
            self.t_anim = t_anim
        self.frozen = True
        self._place_overlay(repaint=True)

    def thaw(self) -> None:
        self.frozen = False

    def advance(self, dt: float) -> None:
        """Move the packets by `dt` seconds and repaint only the rows they touch."""
        if self.frozen or self._dirty_static:
            return
        self.t_anim += dt
        self._place_overlay(repaint=True)

    # --------------------------------------------------------------- styles

    def notify_style_update(self) -> None:
        self._styles.clear()
        self._strips.clear()
        super().notify_style_update()

    def _style(self, key: str) -> Style:
        st = self._styles.get(key)
        if st is None:
            if not key:
                st = self.rich_style
            else:
                parts = key.split("+")
                st = self.get_component_rich_style(*(f"flow--{p}" for p in parts[:1]))
                for p in parts[1:]:
                    st = st + self.get_component_rich_style(f"flow--{p}", partial=True)
            self._styles[key] = st
        return st

    # --------------------------------------------------------------- layout

    def _area(self) -> tuple[int, int, int]:
        """(width, height of the node area, its first row): row 0 is the banner when
        there are 4 rows or more, the last row the legend when there are 9 or more."""
        w, h = self.size.width, self.size.height
        if h >= 9:
            return w, h - 2, 1
        if h >= 4:
            return w, h - 1, 1
        return w, h, 0

    def _build(self) -> None:
        w, h, top = self._area()
        data = self.data
        # Plain tuples: at 1,024 ranks hashing and comparing them is C work, where
        # NodeSpec dataclasses cost ~3 ms a snapshot.
        places = tuple([(n.rank, n.host, n.gpu) for n in data.nodes])
        key = (w, h, places, tuple(sorted(data.fabric.items())))
        if key != self._layout_key:
            specs = [NodeSpec(*p) for p in places]
            self.flow_layout = make_layout(specs, w, h, data.fabric) if specs else None
            self._layout_key = key
        lay = self.flow_layout
        W, H = self.size.width, self.size.height
        cv = Canvas(W, H)
        self._streams, self._blink, self._spin = [], [], []
        if lay is not None:
            base = lay.canvas
            for y in range(lay.h):
                cv.ch[y + top][:lay.w] = base.ch[y]
                cv.st[y + top][:lay.w] = base.st[y]
            self._draw_edges(cv, lay, top)
            self._draw_nodes(cv, lay, top)
        if top:
            self._draw_banner(cv)
        if top and h + top < H:
            self._draw_legend(cv, H - 1, lay)
        sub = {"ring": "ring of ranks", "hosts": "hosts · GPUs · fabric", "grid": "one cell per rank"}.get(
            lay.kind if lay is not None else "", "")
        if lay is not None and lay.note:
            sub = lay.note
        if sub != self.border_subtitle:
            self.border_subtitle = sub
        self._canvas = cv
        self._strips.clear()
        self._dirty_static = False
        self._place_overlay(repaint=False)

    def _draw_edges(self, cv: Canvas, lay: Layout, top: int) -> None:
        if lay.kind == "grid":
            return  # no edges: _draw_grid spins the senders' cells
        data, focus = self.data, self.focus_rank
        rates = data.rates
        peak = max((r.Bps for r in rates.values()), default=0.0)
        edges = set(data.recent) | set(rates)
        # Quiet edges first, so active ones are drawn over them where they cross.
        for key in sorted(edges, key=lambda k: (k in rates, k)):
            src, dst = key
            if dst == HUB:
                continue
            path = lay.path(src, dst)
            if not path:
                continue
            touches = focus is None or focus in key
            rate = rates.get(key)
            if lay.kind == "ring":
                st = "line-active" if (rate is not None and touches) else ("line" if touches else "line-dim")
                for (x, y, _), g in zip(path, line_glyphs(path)):
                    cv.put(x, y + top, g, st)
            if rate is None or not touches:
                continue
            glyphs = PACKET[rate.modelled]
            cells = [(x, y + top, glyphs[d]) for x, y, d in path]
            self._streams.append(_Stream(cells, spacing_for(rate.Bps, peak), f"pkt-{rate_level(rate.Bps)}"))
        # Who waits for whom in a diagnosis: a red dotted line (ring) or red fabric (hosts).
        for w, m in data.waits:
            if focus is not None and focus not in (w, m):
                continue
            path = lay.path(w, m)
            for x, y, _ in path or ():
                if lay.kind == "ring":
                    cv.put(x, y + top, "·", "node-hung")
                elif cv.ch[y + top][x] != " ":
                    cv.st[y + top][x] = "node-hung"

    def _draw_nodes(self, cv: Canvas, lay: Layout, top: int) -> None:
        data, focus = self.data, self.focus_rank
        peers: set[int] = set()
        if focus is not None:
            for s, d in set(data.recent) | set(data.rates):
                if s == focus:
                    peers.add(d)
                elif d == focus:
                    peers.add(s)
        busy = {s for s, _ in data.rates} | {d for _, d in data.rates}
        if lay.kind == "grid":
            self._draw_grid(cv, lay, top, busy, peers)
            return
        nodes = {n.rank: n for n in data.nodes}
        for rank, (x, y, w) in lay.nodes.items():
            n = nodes.get(rank)
            st = n.status if n is not None else RankStatus.OK
            core = f"{GLYPH.get(st, '●')}{rank}"
            text = (" " + core if w >= len(core) + 2 else core).ljust(w)[:w]
            style = self._node_style(st, rank in busy)
            if rank == focus:
                style += "+focus"
            elif rank in peers:
                style += "+peer"
            cv.text(x, y + top, text, style)
            if st in ALARMING:
                self._blink.append((x, y + top, text, _blink_style(st)))

    def _draw_grid(self, cv: Canvas, lay: Layout, top: int, busy: set[int], peers: set[int]) -> None:
        """A cell per rank (or per few): its glyph and style, and a spin where it sends
        (faster the more it sends). One pass over the cells, a single rank's cell read
        without sets or generators: at 1,024 ranks this is most of a snapshot's
        drawing, four times a second."""
        data, focus = self.data, self.focus_rank
        tx: dict[int, float] = {}
        for (s, _d), r in data.rates.items():
            tx[s] = tx.get(s, 0.0) + r.Bps
        peak = max((r.Bps for r in data.rates.values()), default=0.0)
        status = {n.rank: n.status for n in data.nodes}
        ok, calm = RankStatus.OK, (RankStatus.OK, RankStatus.WAITING)
        spin, blink = self._spin, self._blink
        looks: dict[tuple, tuple[str, str]] = {}  # (status, busy, number or "") -> (glyph text, style)
        W, H = cv.w, cv.h
        for x, y, cw, ranks in lay.cells:
            y += top
            if len(ranks) == 1:
                r = ranks[0]
                st = status.get(r, ok)
                bps = tx.get(r, 0.0)
                is_busy = r in busy
                mark = "+focus" if r == focus else ("+peer" if r in peers else "")
                label = str(r) if cw > 2 else ""
            else:
                st = _worst(status.get(r, ok) for r in ranks)
                bps = sum(tx.get(r, 0.0) for r in ranks)
                is_busy = any(r in busy for r in ranks)
                mark = "+focus" if focus in ranks else ("+peer" if peers.intersection(ranks) else "")
                label = ""
            look = looks.get((st, is_busy, label))
            if look is None:
                look = looks[st, is_busy, label] = ((GLYPH[st] + label).ljust(cw)[:cw], self._node_style(st, is_busy))
            text, style = look
            if 0 <= y < H and 0 <= x and x + cw <= W:
                cv.ch[y][x:x + cw] = text
                cv.st[y][x:x + cw] = [style + mark] * cw
            else:
                cv.text(x, y, text, style + mark)
            if st in ALARMING:
                blink.append((x, y, text[:1], _blink_style(st)))
            if bps > 0 and st in calm:
                spin.append((x, y, 1.0 + 3.0 * (bps / peak if peak else 0.0), f"pkt-{rate_level(bps)}"))

    @staticmethod
    def _node_style(status: RankStatus, busy: bool) -> str:
        if status == RankStatus.OK:
            return "node-busy" if busy else "node-ok"
        return f"node-{status}"

    def _draw_banner(self, cv: Canvas) -> None:
        text = self.data.banner
        if self.focus_rank is not None and not self.data.alert:
            text = f"focus: rank {self.focus_rank} (esc: all ranks) · " + text
        st = "banner-alert" if self.data.alert else "banner"
        cv.text(0, 0, (" " + text).ljust(cv.w)[: cv.w], st)

    def _draw_legend(self, cv: Canvas, y: int, lay: Layout | None) -> None:
        """Key to glyphs and colours; items that do not fit are left out whole."""
        items: list[list[tuple[str, str]]] = []
        if lay is not None and lay.kind != "grid":
            items += [[("▸", "pkt-2"), ("exact ", "legend")], [("▹", "pkt-2"), ("modelled  ", "legend")]]
        elif lay is not None:
            items += [[("◓", "pkt-2"), ("sending  ", "legend")]]
        items += [[("●", "node-ok"), ("idle ", "legend")], [("◐", "node-waiting"), ("in op ", "legend")],
                  [("◐", "node-hung"), ("hung ", "legend")], [("?", "node-missing"), ("missing ", "legend")],
                  [("✕", "node-dead"), ("dead  ", "legend")]]
        items += [[("■", f"pkt-{i + 1}"), (t + " ", "legend")] for i, t in enumerate(RATE_TEXT)]
        x = 1
        for item in items:
            n = sum(len(t) for t, _ in item)
            if x + n > cv.w:
                continue
            for text, st in item:
                cv.text(x, y, text, st)
                x += len(text)

    # ------------------------------------------------------------ animation

    def _place_overlay(self, repaint: bool) -> None:
        t = self.t_anim
        shift = int(t * CELLS_PER_S)
        over: dict[int, dict[int, tuple[str, str]]] = {}
        for s in self._streams:
            cells, sp = s.cells, s.spacing
            for i in range(shift % sp, len(cells), sp):
                x, y, g = cells[i]
                over.setdefault(y, {})[x] = (g, s.style)
        for x, y, turns, st in self._spin:
            over.setdefault(y, {})[x] = (SPIN[int(t * turns * 4) % 4], st)
        if int(t * 2) % 2 == 1:
            for x, y, text, st in self._blink:
                row = over.setdefault(y, {})
                for i, c in enumerate(text):
                    row[x + i] = (c, st)
        old = self._overlay
        self._overlay = over
        if repaint:
            w = self.size.width
            rows = set(over) | set(old)
            for y in rows:
                self._strips.pop(y, None)
            if rows:
                self.refresh(*(Region(0, y, w, 1) for y in sorted(rows)))

    # ------------------------------------------------------------- drawing

    def render_line(self, y: int) -> Strip:
        if self._dirty_static or self._canvas is None or self._canvas.w != self.size.width \
                or self._canvas.h != self.size.height:
            self._build()
        if y == 0:
            self.frames += 1
        self.lines_rendered += 1
        strip = self._strips.get(y)
        if strip is not None:
            return strip
        cv = self._canvas
        if y >= cv.h:
            return Strip.blank(self.size.width, self.rich_style)
        chars, keys = cv.ch[y], cv.st[y]
        over = self._overlay.get(y)
        if over:
            chars, keys = chars[:], keys[:]
            for x, (c, k) in over.items():
                if 0 <= x < cv.w:
                    chars[x] = c
                    keys[x] = k
        segs = []
        run_key = keys[0] if keys else ""
        start = 0
        for x in range(1, len(keys) + 1):
            if x == len(keys) or keys[x] != run_key:
                segs.append(Segment("".join(chars[start:x]), self._style(run_key)))
                if x < len(keys):
                    run_key, start = keys[x], x
        strip = Strip(segs, cv.w)
        self._strips[y] = strip
        return strip

    def on_resize(self) -> None:
        self._dirty_static = True
        if self.size.width and self.size.height:
            self._build()
        self.refresh()

    def on_click(self, event) -> None:
        lay = self.flow_layout
        if lay is None:
            return
        _, _, top = self._area()
        off = event.get_content_offset(self)
        if off is None:
            return
        rank = lay.node_at(off.x, off.y - top)
        if rank is not None:
            self.post_message(self.RankClicked(rank))

    def text_lines(self) -> list[str]:
        """The view as plain text rows (tests and `bench/render.py`)."""
        return [self.render_line(y).text for y in range(self.size.height)]


def _worst(statuses) -> RankStatus:
    got = set(statuses)
    for s in SEVERITY:
        if s in got:
            return s
    return RankStatus.OK


def _blink_style(status: RankStatus) -> str:
    return f"node-{status}+focus"

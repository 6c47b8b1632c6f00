"""Where the flow view puts ranks and how edges run between them: pure geometry on a
character grid, no Textual, so it is testable and cheap to rebuild.

Three layouts, tried in this order:

- ``hosts``: GPU ranks (or ranks on several hosts), each host a box with its GPUs in a
  row over the host's fabric bar (NVSwitch / NVLink / PCIe, from the topology when
  known); hosts side by side on a network bar. Edges run down a GPU's stub, along the
  fabric (and the network, between hosts) and up to the peer.
- ``ring``: CPU ranks on one host, on an ellipse in rank order; edges are straight lines.
- ``grid``: anything that does not fit: one cell per rank (or per few ranks), one row
  of cells per host when hosts are known. No edges are drawn; the focused rank's peers
  are marked instead.

A `Layout` holds a `Canvas` of the static parts (boxes, bars, labels) and where each
rank's label sits; `path(src, dst)` gives the cells an edge runs through, in the
direction of travel, with the direction of each step (for packet glyphs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

RIGHT, LEFT, DOWN, UP = 0, 1, 2, 3
RING_MAX = 48  # more ranks than this never go on a ring


@dataclass(frozen=True)
class NodeSpec:
    rank: int
    host: str
    gpu: int | None = None  # GPU index on its host; None for CPU ranks / unknown


class Canvas:
    """A grid of characters with a style key per cell ("" = the widget's own style)."""

    def __init__(self, w: int, h: int) -> None:
        self.w, self.h = w, h
        self.ch = [[" "] * w for _ in range(h)]
        self.st = [[""] * w for _ in range(h)]

    def put(self, x: int, y: int, ch: str, st: str = "") -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            self.ch[y][x] = ch
            self.st[y][x] = st

    def text(self, x: int, y: int, s: str, st: str = "") -> None:
        for i, c in enumerate(s):
            self.put(x + i, y, c, st)

    def row_text(self, y: int) -> str:
        return "".join(self.ch[y])


@dataclass
class Layout:
    kind: str  # "ring" | "hosts" | "grid"
    w: int
    h: int
    canvas: Canvas
    nodes: dict[int, tuple[int, int, int]]  # rank -> (x, y, width) of its label
    node_w: int = 0
    note: str = ""  # e.g. "4 ranks per cell"
    # grid: cells (x, y, width, ranks in it)
    cells: list[tuple[int, int, int, tuple[int, ...]]] = field(default_factory=list)
    # hosts: geometry for routing
    _stub: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # rank -> (x, stub y, bar y)
    _port: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # host -> (x, bar y, net y)
    _host_of: dict[int, str] = field(default_factory=dict)
    _trunk: int = 0
    _paths: dict[tuple[int, int], list[tuple[int, int, int]] | None] = field(default_factory=dict)
    occupied: set[tuple[int, int]] = field(default_factory=set)

    def path(self, src: int, dst: int) -> list[tuple[int, int, int]] | None:
        """Cells (x, y, direction of travel) from src to dst, None when not drawable."""
        key = (src, dst)
        if key in self._paths:
            return self._paths[key]
        p = None
        if src in self.nodes and dst in self.nodes and src != dst:
            if self.kind == "ring":
                p = self._ring_path(src, dst)
            elif self.kind == "hosts":
                p = self._host_path(src, dst)
        if len(self._paths) > 4096:
            self._paths.clear()
        self._paths[key] = p
        return p

    def node_at(self, x: int, y: int) -> int | None:
        for rank, (nx, ny, w) in self.nodes.items():
            if ny == y and nx <= x < nx + w:
                return rank
        for cx, cy, cw, ranks in self.cells:
            if cy == y and cx <= x < cx + cw and ranks:
                return ranks[0]
        return None

    # ----------------------------------------------------------- ring paths

    def _centre(self, rank: int) -> tuple[int, int]:
        x, y, w = self.nodes[rank]
        return x + w // 2, y

    def _ring_path(self, src: int, dst: int) -> list[tuple[int, int, int]] | None:
        (x0, y0), (x1, y1) = self._centre(src), self._centre(dst)
        pts = line_cells(x0, y0, x1, y1)
        out = _with_directions(pts)
        out = [c for c in out if (c[0], c[1]) not in self.occupied]
        return out or None

    # ---------------------------------------------------------- host paths

    def _host_path(self, src: int, dst: int) -> list[tuple[int, int, int]] | None:
        sx, s_stub, s_bar = self._stub[src]
        dx, d_stub, d_bar = self._stub[dst]
        hs, hd = self._host_of[src], self._host_of[dst]
        pts: list[tuple[int, int]] = [(sx, s_stub)]
        if hs == hd:
            pts += _hline(sx, dx, s_bar)
        else:
            px, _, net = self._port[hs]
            qx, _, qnet = self._port[hd]
            pts += _hline(sx, px, s_bar)
            pts += [(px, y) for y in range(s_bar + 1, net)]
            if net == qnet:
                pts += _hline(px, qx, net)
            else:  # via the trunk
                t = self._trunk
                pts += _hline(px, t, net)
                step = 1 if qnet > net else -1
                pts += [(t, y) for y in range(net + step, qnet, step)]
                pts += _hline(t, qx, qnet)
            pts += [(qx, y) for y in range(qnet - 1, d_bar, -1)]
            pts += _hline(qx, dx, d_bar)
        pts.append((dx, d_stub))
        # drop repeats where segments meet
        clean = [pts[0]]
        for p in pts[1:]:
            if p != clean[-1]:
                clean.append(p)
        return _with_directions(clean)


def _round(v: float) -> int:
    """Half up, and immune to the 1e-16 that cos/sin leave at multiples of pi."""
    return int(math.floor(v + 0.5 + 1e-9))


def _hline(x0: int, x1: int, y: int) -> list[tuple[int, int]]:
    step = 1 if x1 >= x0 else -1
    return [(x, y) for x in range(x0, x1 + step, step)]


def line_cells(x0: int, y0: int, x1: int, y1: int) -> list[tuple[int, int]]:
    """Bresenham's line, both ends included."""
    pts = []
    dx, dy = abs(x1 - x0), -abs(y1 - y0)
    sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
    err = dx + dy
    x, y = x0, y0
    while True:
        pts.append((x, y))
        if x == x1 and y == y1:
            break
        e2 = 2 * err
        if e2 >= dy:
            err += dy
            x += sx
        if e2 <= dx:
            err += dx
            y += sy
    return pts


def _direction(dx: int, dy: int) -> int:
    if dx > 0:
        return RIGHT
    if dx < 0:
        return LEFT
    return DOWN if dy > 0 else UP


def _with_directions(pts: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    out = []
    for i, (x, y) in enumerate(pts):
        if i + 1 < len(pts):
            nx, ny = pts[i + 1]
            d = _direction(nx - x, ny - y)
        elif i > 0:
            px, py = pts[i - 1]
            d = _direction(x - px, y - py)
        else:
            d = RIGHT
        out.append((x, y, d))
    return out


def line_char(dx: int, dy: int) -> str:
    """The box-drawing character for one step of a straight line."""
    if dy == 0:
        return "─"
    if dx == 0:
        return "│"
    return "╲" if (dx > 0) == (dy > 0) else "╱"


def line_glyphs(path: list[tuple[int, int, int]]) -> list[str]:
    """Static line characters along a path (by each cell's step)."""
    out = []
    for i, (x, y, _) in enumerate(path):
        if i + 1 < len(path):
            nx, ny, _ = path[i + 1]
            dx, dy = nx - x, ny - y
        elif i > 0:
            px, py, _ = path[i - 1]
            dx, dy = x - px, y - py
        else:
            dx, dy = 1, 0
        if abs(dx) > 1 or abs(dy) > 1:  # a gap (a node was skipped): keep the slope
            dx, dy = (dx > 0) - (dx < 0), (dy > 0) - (dy < 0)
        out.append(line_char(dx, dy))
    return out


def node_width(ranks) -> int:
    """" ●12 ": glyph, digits, a space either side."""
    return 3 + len(str(max(ranks, default=0)))


# ------------------------------------------------------------------- layouts


def make_layout(nodes: list[NodeSpec], w: int, h: int, fabric: dict[str, str] | None = None) -> Layout:
    """The best layout of `nodes` in a w×h area. `fabric`: host -> label of its GPU
    fabric ("NVSwitch", "NVLink", "PCIe"); hosts not in it get one from their ranks."""
    w, h = max(1, w), max(1, h)
    hosts = {n.host for n in nodes}
    gpus = any(n.gpu is not None for n in nodes)
    if gpus or len(hosts) > 1:
        lay = hosts_layout(nodes, w, h, fabric or {})
        if lay is not None:
            return lay
    elif len(nodes) <= RING_MAX:
        lay = ring_layout([n.rank for n in nodes], w, h)
        if lay is not None:
            return lay
    return grid_layout(nodes, w, h, by_host=len(hosts) > 1 or gpus)


def ring_layout(ranks: list[int], W: int, H: int) -> Layout | None:
    ranks = sorted(ranks)
    n = len(ranks)
    nw = node_width(ranks)
    if n == 0 or W < nw + 2 or H < 1:
        return None
    cx, cy = (W - nw) / 2, (H - 1) / 2
    a, b = (W - nw) / 2, (H - 1) / 2
    nodes: dict[int, tuple[int, int, int]] = {}
    for i, r in enumerate(ranks):
        if n == 1:
            th = 0.0
            x, y = cx, cy
        else:
            th = (math.pi if n == 2 else -math.pi / 2) + 2 * math.pi * i / n
            x, y = cx + a * math.cos(th), cy + b * math.sin(th)
        nodes[r] = (_round(x), _round(y), nw)
    # Labels must not touch on a row.
    by_row: dict[int, list[tuple[int, int]]] = {}
    for x, y, _ in nodes.values():
        by_row.setdefault(y, []).append((x, x + nw))
    for spans in by_row.values():
        spans.sort()
        for (a0, a1), (b0, _) in zip(spans, spans[1:]):
            if b0 < a1 + 1:
                return None
    lay = Layout("ring", W, H, Canvas(W, H), nodes, node_w=nw)
    lay.occupied = {(x + k, y) for x, y, ww in nodes.values() for k in range(ww)}
    # Every ring neighbour pair needs at least one free cell between them to show traffic.
    if n > 2:
        for i in range(n):
            if not lay.path(ranks[i], ranks[(i + 1) % n]):
                return None
    elif n == 2 and not lay.path(ranks[0], ranks[1]):
        return None
    return lay


def hosts_layout(nodes: list[NodeSpec], W: int, H: int, fabric: dict[str, str]) -> Layout | None:
    """Host boxes in rows; each row of boxes over its own stretch of network bar, the
    stretches joined by a trunk on the right when there are several rows."""
    groups = _by_host(nodes)
    nw = 1 + len(str(max((n.rank for n in nodes), default=0)))  # "●12"
    multi = len(groups) > 1
    titles, widths = {}, {}
    for host, g in groups.items():
        label = fabric.get(host) or ("GPU" if any(n.gpu is not None for n in g) else "CPU")
        titles[host] = f" {host} · {label} "
        inner = 1 + len(g) * (nw + 1) + (2 if multi else 0)
        widths[host] = max(inner, min(len(titles[host]), 36) + 2) + 2
    rows = _pack_rows(list(groups), widths, W - 2)  # W - 2: room for the trunk
    row_h = 7 if multi else 5
    if rows is None or row_h * len(rows) > H:
        return None
    cv = Canvas(W, H)
    lay = Layout("hosts", W, H, cv, {}, node_w=nw)
    y_top = (H - row_h * len(rows)) // 2
    trunk = W - 2
    nets = []
    for ri, row in enumerate(rows):
        y0 = y_top + ri * row_h
        total = sum(widths[h] for h in row) + len(row) - 1
        x = (W - 2 - total) // 2 if len(rows) > 1 else (W - total) // 2
        ports = []
        for host in row:
            _draw_host(lay, x, y0, widths[host], titles[host], groups[host], multi, ports)
            x += widths[host] + 1
        if multi:
            hi = trunk if len(rows) > 1 else max(ports)
            nets.append(_draw_network(cv, ports, hi, y0 + 6, len(rows) == 1, ri == len(rows) - 1))
    if len(nets) > 1:
        for y in range(nets[0], nets[-1] + 1):
            if cv.ch[y][trunk] == " ":
                cv.put(trunk, y, "│", "line")
        cv.put(trunk, nets[0], "┐", "line")
        cv.put(trunk, nets[-1], "┘", "line")
        lay._trunk = trunk
    lay.occupied = {(nx + k, ny) for nx, ny, ww in lay.nodes.values() for k in range(ww)}
    return lay


def _by_host(nodes: list[NodeSpec]) -> dict[str, list[NodeSpec]]:
    """Nodes per host (hosts in order of their lowest rank), each by GPU then rank."""
    groups: dict[str, list[NodeSpec]] = {}
    for nd in sorted(nodes, key=lambda n: n.rank):
        groups.setdefault(nd.host, []).append(nd)
    for g in groups.values():
        g.sort(key=lambda n: (n.gpu if n.gpu is not None else 1 << 30, n.rank))
    return groups


def _pack_rows(hosts: list[str], widths: dict[str, int], usable: int) -> list[list[str]] | None:
    """Host boxes into rows of at most `usable` columns (None: a box is too wide)."""
    rows: list[list[str]] = [[]]
    used = 0
    for host in hosts:
        bw = widths[host]
        if bw > usable:
            return None
        if rows[-1] and used + 1 + bw > usable:
            rows.append([])
            used = 0
        used += (1 if rows[-1] else 0) + bw
        rows[-1].append(host)
    return rows


def _draw_host(lay: Layout, x: int, y0: int, bw: int, title: str, g: list[NodeSpec], multi: bool,
               ports: list[int]) -> None:
    """One host's box at (x, y0): its ranks on a fabric bar, and with several hosts a
    port down to the network (appended to `ports`)."""
    cv, nw, host = lay.canvas, lay.node_w, g[0].host
    y_node, y_stub, y_bar, y_bot, y_net = y0 + 1, y0 + 2, y0 + 3, y0 + 4, y0 + 6
    _box(cv, x, y0, bw, 5, title[: bw - 4])
    stubs = []
    for i, nd in enumerate(g):
        nx = x + 2 + i * (nw + 1)
        lay.nodes[nd.rank] = (nx, y_node, nw)
        sx = nx + nw // 2
        stubs.append(sx)
        lay._stub[nd.rank] = (sx, y_stub, y_bar)
        lay._host_of[nd.rank] = host
    px = x + bw - 3
    lo, hi = min(stubs), (px if multi else max(stubs))
    for bx in range(lo, hi + 1):
        cv.put(bx, y_bar, "═", "fabric")
    for sx in stubs:
        cv.put(sx, y_stub, "│", "line")
        cv.put(sx, y_bar, "╤", "fabric")
    if not multi and len(stubs) == 1:
        cv.put(stubs[0], y_bar, " ")
    if multi:
        cv.put(px, y_bar, "╕", "fabric")
        cv.put(px, y_bot, "┬", "box")
        cv.put(px, y0 + 5, "│", "line")
        lay._port[host] = (px, y_bar, y_net)
        ports.append(px)


def _draw_network(cv: Canvas, ports: list[int], hi: int, y_net: int, one_row: bool, labelled: bool) -> int:
    """A row's stretch of network bar under its hosts' ports, up to `hi`; returns its y."""
    lo = min(ports)
    for bx in range(lo, hi + 1):
        cv.put(bx, y_net, "─", "line")
    for px in ports:
        cv.put(px, y_net, "┴", "line")
    cv.put(lo, y_net, "└", "line")
    cv.put(hi, y_net, "┘" if one_row else "┤", "line")
    label = "network"
    if hi - lo > len(label) + 4 and labelled:
        cv.text(hi - len(label) - 1, y_net - 1, label, "label")
    return y_net


def _box(cv: Canvas, x: int, y: int, w: int, h: int, title: str) -> None:
    cv.put(x, y, "╭", "box")
    cv.put(x + w - 1, y, "╮", "box")
    cv.put(x, y + h - 1, "╰", "box")
    cv.put(x + w - 1, y + h - 1, "╯", "box")
    for i in range(x + 1, x + w - 1):
        cv.put(i, y, "─", "box")
        cv.put(i, y + h - 1, "─", "box")
    for j in range(y + 1, y + h - 1):
        cv.put(x, j, "│", "box")
        cv.put(x + w - 1, j, "│", "box")
    cv.text(x + 2, y, title, "title")


def grid_layout(nodes: list[NodeSpec], W: int, H: int, by_host: bool) -> Layout:
    ordered = sorted(nodes, key=lambda n: n.rank)
    groups: list[tuple[str, list[int]]] = []
    if by_host:
        idx: dict[str, int] = {}
        for nd in ordered:
            if nd.host not in idx:
                idx[nd.host] = len(groups)
                groups.append((nd.host, []))
            groups[idx[nd.host]][1].append(nd.rank)
    else:
        groups = [("", [n.rank for n in ordered])]
    n = len(ordered)
    digits = len(str(max((nd.rank for nd in ordered), default=0)))
    lay = Layout("grid", W, H, Canvas(W, H), {}, node_w=0)
    label_w = 0
    if by_host and len(groups) > 1:
        label_w = min(12, max(len(g[0]) for g in groups)) + 1
    elif n > 0:
        label_w = digits + 1
    avail = max(1, W - label_w)
    for cw in (digits + 2, 2, 1):
        per_row = max(1, avail // cw)
        rows = sum(math.ceil(len(rs) / per_row) for _, rs in groups)
        if rows <= H:
            break
    else:
        # Too many even at one cell each: several ranks per cell, in rank order.
        cw = 1
        per_row = avail
        k = math.ceil(n / (per_row * H))
        bins = [tuple(nd.rank for nd in ordered[i:i + k]) for i in range(0, n, k)]
        lay.note = f"{k} ranks per cell"
        y = 0
        for i in range(0, len(bins), per_row):
            lay.canvas.text(0, y, str(bins[i][0]).rjust(label_w - 1)[: label_w - 1], "label")
            for j, b in enumerate(bins[i:i + per_row]):
                lay.cells.append((label_w + j, y, 1, b))
                for r in b:
                    lay.nodes[r] = (label_w + j, y, 1)
            y += 1
        return lay
    y = 0
    for name, rs in groups:
        for i in range(0, len(rs), per_row):
            head = name if name else str(rs[i])
            if i == 0 or not name:
                lay.canvas.text(0, y, head[: label_w - 1].rjust(label_w - 1) if not name else head[: label_w - 1],
                                "label")
            for j, r in enumerate(rs[i:i + per_row]):
                x = label_w + j * cw
                lay.cells.append((x, y, cw, (r,)))
                lay.nodes[r] = (x, y, cw)
            y += 1
    lay.node_w = cw
    return lay

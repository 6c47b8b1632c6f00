"""The links panel: what each edge carries over the last second, how (NVLink, PCIe,
network, local), against the link's capacity when the topology knows it — and, where
the probe's NVML samples have them, each GPU's measured NVLink traffic next to what
the model says its rank sent.

Pure rows here (`link_rows`); the app shows them in a DataTable.
"""

from __future__ import annotations

from typing import Collection

from rich.text import Text

from commviz.model.flows import HUB, EdgeRate
from commviz.model.placement import Place, link_kind
from commviz.tui.fmt import format_bps

LINK_COLUMNS = [
    ("edge", "link", False), ("rate", "now", True), ("how", "source", False), ("via", "via", False),
    ("util", "util", False), ("cap", "of", True), ("op", "carries", False),
]
MAX_ROWS = 40
# An edge on screen keeps its row while it carries at least this share of the rate
# of the last edge that would make the cut: at 1,024 ranks a ring's edges carry
# nearly the same, and ranked afresh each second most of the rows changed (each
# removed row also cost the whole screen a new layout, ~80 ms on these 2 cores).
STAY = 0.5


def util_bar(frac: float | None, cells: int = 4) -> Text:
    if frac is None:
        return Text("–", style="dim")
    frac = max(0.0, frac)
    full = min(cells, int(round(frac * cells)))
    style = "red" if frac > 0.9 else ("yellow" if frac > 0.6 else "green")
    t = Text("▮" * full, style=style)
    t.append("▯" * (cells - full), style="dim")
    t.append(" " + util_text(frac))
    return t


def util_text(frac: float) -> str:
    """Under 1% still says how much, in at most 5 columns (a CPU job's MB/s against
    NVLink's GB/s): 0.1%, 0.01%, <.01%."""
    if frac >= 0.01 or frac <= 0:
        return f"{frac:4.0%}"
    if frac < 0.0001:
        return "<.01%"
    return f"{frac * 100:.1g}%"


def link_rows(rates: dict[tuple[int, int], EdgeRate], places: dict[int, Place], topology=None,
              samples: dict[str, dict[str, float]] | None = None, focus: int | None = None,
              limit: int = MAX_ROWS, topologies: dict | None = None,
              shown: Collection[str] = ()) -> list[tuple[str, tuple]]:
    """(row key, cells) for the links table: measured NVLink per GPU first, then edges
    by rate (the focused rank's only, when one is focused). `topologies`: host -> the
    topology of that host (the snapshot's); a host not in it is taken to be `topology`.
    `shown`: the row keys on screen now: past `limit` edges, those that still carry
    `STAY` of the cut's rate keep their rows, and the fastest others fill the rest."""
    def topo(host: str):
        return topologies[host] if topologies is not None and host in topologies else topology

    rows: list[tuple[str, tuple]] = []
    # Measured: per GPU, from the host's samples (local rank 0 sends them).
    sent_by: dict[int, float] = {}
    for (s, d), r in rates.items():
        sent_by[s] = sent_by.get(s, 0.0) + r.Bps
    for host, vals in sorted((samples or {}).items()):
        gpus = sorted({int(k[3:k.index(".")]) for k in vals if k.startswith("gpu") and k.endswith(".nvlink.tx_Bps")
                       and k[3:k.index(".")].isdigit()})
        for i in gpus:
            rank = next((rk for rk, p in places.items() if p.host == host and p.gpu == i), None)
            if focus is not None and rank != focus:
                continue
            tx = vals.get(f"gpu{i}.nvlink.tx_Bps", 0.0)
            rx = vals.get(f"gpu{i}.nvlink.rx_Bps", 0.0)
            cap = None
            t = topo(host)
            if t is not None and i < len(t.gpus):
                cap = t.gpus[i].nvlink_gbps_per_direction
            who = f"gpu{i}" + (f" r{rank}" if rank is not None else "") + f"@{host}"
            model_txt = f"model {format_bps(sent_by.get(rank, 0.0))}" if rank is not None else ""
            rows.append((f"nv:{host}:{i}", (
                who,
                Text(format_bps(tx), justify="right"),
                Text("measured", style="bold"),
                "NVLink",
                util_bar(tx / (cap * 1e9) if cap else None),
                Text(f"{cap:.3g} GB/s" if cap else "–", justify="right"),
                f"tx; rx {format_bps(rx)}" + (f" · {model_txt}" if model_txt else ""),
            )))
    edges = [r for r in rates.values() if focus is None or focus in (r.src, r.dst)]
    edges.sort(key=lambda r: (-r.Bps, r.src, r.dst))
    for r in _pick(edges, max(0, limit - len(rows)), shown):
        if r.dst == HUB:
            via, cap = "all peers", None
            name = f"{r.src}→*"
        else:
            a, b = places.get(r.src), places.get(r.dst)
            via, cap = link_kind(a, b, topo(a.host)) if a and b else ("?", None)
            name = f"{r.src}→{r.dst}"
        modelled = r.modelled
        rows.append((_key(r), (
            name,
            Text(format_bps(r.Bps), justify="right"),
            Text("modelled", style="italic") if modelled else Text("exact", style="bold"),
            via,
            util_bar(r.Bps / (cap * 1e9) if cap else None),
            Text(f"{cap:.3g} GB/s" if cap else "–", justify="right"),
            r.op,
        )))
    return rows


def _key(r: EdgeRate) -> str:
    """An edge's row key: the table keeps a link's row by it (`_pick`'s `shown`)."""
    return f"e:{r.src}:{r.dst}"


def _pick(ranked: list[EdgeRate], room: int, shown: Collection[str]) -> list[EdgeRate]:
    """At most `room` of the edges (fastest first), in rate order: those in `shown`
    stay while they carry STAY of the rate of the `room`-th fastest, unless an edge
    not shown carries more than 1/STAY of a stayer's (a link that starts to carry
    far more than the rest must show at once)."""
    if len(ranked) <= room or not shown or not room:
        return ranked[:room]
    bar = ranked[room - 1].Bps * STAY
    stay = [r for r in ranked if r.Bps >= bar and _key(r) in shown][:room]
    kept = {id(r) for r in stay}
    others = [r for r in ranked if id(r) not in kept]
    fill, rest = others[: room - len(stay)], others[room - len(stay):]
    for r in rest:  # fastest first, against the slowest stayer
        if not stay or r.Bps * STAY <= stay[-1].Bps:
            break
        stay.pop()
        fill.append(r)
    return sorted(stay + fill, key=lambda r: (-r.Bps, r.src, r.dst))

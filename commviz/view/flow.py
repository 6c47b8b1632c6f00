"""The flow view's data: which ranks to draw where, with what status, and the edges
that carry traffic. Built with the snapshot (view/snapshot.py), drawn by
`tui.widgets.flow.FlowView`; plain dataclasses so a collector can send them to a
view in another process (viewlink.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from commviz.model.diagnosis import RankStatus
from commviz.model.flows import EdgeRate


@dataclass(frozen=True)
class FlowNode:
    """One rank as the flow view draws it."""

    rank: int
    host: str
    gpu: int | None
    status: RankStatus
    op: str = ""  # the op it is in ("" when idle)


@dataclass
class FlowData:
    """Everything the view needs from one model snapshot."""

    nodes: list[FlowNode]
    rates: dict[tuple[int, int], EdgeRate] = field(default_factory=dict)
    recent: list[tuple[int, int]] = field(default_factory=list)  # edges that moved anything lately
    fabric: dict[str, str] = field(default_factory=dict)  # host -> "NVSwitch" | "NVLink" | "PCIe"
    banner: str = ""  # top line: a diagnosis or what moves
    alert: bool = False  # banner is a diagnosis
    waits: list[tuple[int, int]] = field(default_factory=list)  # (waiting rank, rank it waits for)

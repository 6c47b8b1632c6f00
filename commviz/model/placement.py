"""Where a rank sits (host, GPU index) and what joins two ranks: the link and its
capacity, from a `Topology`. Also the simulated placement that lets CPU ranks be
shown on a preset's GPUs (`commviz lesson/watch/replay --topology PRESET` on a
machine without them): rank i on GPU i mod G of host i div G, G the preset's GPUs
per host. Pure: the topology (`commviz.topo.Topology`) is handed in, never loaded here.
"""

from __future__ import annotations

from dataclasses import dataclass

# PCIe: usable GB/s per lane and direction by generation (after encoding).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@dataclass(frozen=True)
class Place:
    host: str
    gpu: int | None  # GPU index on its host (None: CPU rank / unknown)


def simulated_place(rank: int, world_size: int, topology) -> Place:
    """A CPU rank placed on the preset: GPU rank mod G of host rank div G. One host
    keeps the preset's name; several are `<name>-0`, `<name>-1`, …"""
    g = max(1, len(topology.gpus))
    hosts = max(1, -(-max(world_size, rank + 1) // g))
    host = topology.host if hosts == 1 else f"{topology.host}-{rank // g}"
    return Place(host, rank % g)


def link_kind(a: Place, b: Place, topology) -> tuple[str, float | None]:
    """(how two ranks are connected, capacity GB/s per direction or None)."""
    if a.host != b.host:
        return "network", None
    if a.gpu is None or b.gpu is None:
        return "local", None
    if topology is None or max(a.gpu, b.gpu) >= len(topology.gpus):
        return "GPU-GPU", None
    nv = topology.nvlinks_between(a.gpu, b.gpu)
    if nv:
        per = [lk.gbps_per_direction for lk in topology.gpus[a.gpu].up_links if lk.gbps_per_direction]
        cap = nv * per[0] if per else None
        return f"NVLink×{nv}", cap
    level = topology.label(a.gpu, b.gpu)
    ga, gb = topology.gpus[a.gpu], topology.gpus[b.gpu]
    caps = [PCIE_LANE_GBPS.get(g.pcie_gen or 0, 0) * (g.pcie_width or 0) for g in (ga, gb)]
    cap = min(caps) if all(caps) else None
    return f"PCIe {level}", cap

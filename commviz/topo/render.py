"""`Topology` → the text `commviz topo` prints: the `nvidia-smi topo -m` matrix, its
legend, then each GPU's links grouped into runs that share an end."""

from __future__ import annotations

from commviz.topo.facts import LEGEND
from commviz.topo.model import Gpu, Link, Topology


def render_topology(topo: Topology) -> str:
    lines = [f"{topo.host}  (source: {topo.source})", ""]
    if not topo.gpus:
        lines.append("no GPUs")
        return "\n".join(lines) + "\n"
    lines += _grid(topo, topo.matrix(), extra=("NUMA", [_s(g.numa_node) for g in topo.gpus]))
    lines += ["", "Legend:", ""]
    lines += [f"  {k:<4} = {v}" for k, v in LEGEND]
    if topo.p2p_read:
        lines += ["", "P2P read (OK = supported; CNS/GNS/TNS = chipset/GPU/topology not supported; "
                  "DR = disabled by regkey; NS = not supported; U = unknown):", ""]
        lines += _grid(topo, [[c or "-" for c in row] for row in topo.p2p_read])
    lines += ["", "Links:"]
    for g in topo.gpus:
        lines.append("")
        lines += _gpu_lines(g, topo)
    if topo.notes:
        lines += ["", "Not available here:"]
        lines += [f"  {n}" for n in topo.notes]
    return "\n".join(lines) + "\n"


def _grid(topo: Topology, cells: list[list[str]], extra: tuple[str, list[str]] | None = None) -> list[str]:
    names = [f"GPU{g.index}" for g in topo.gpus]
    width = max(6, *(len(c) + 2 for row in cells for c in row), *(len(n) + 2 for n in names))
    head = " " * 8 + "".join(n.ljust(width) for n in names) + (extra[0] if extra else "")
    out = [head.rstrip()]
    for i, row in enumerate(cells):
        line = names[i].ljust(8) + "".join(c.ljust(width) for c in row) + (extra[1][i] if extra else "")
        out.append(line.rstrip())
    return out


def _gpu_lines(g: Gpu, topo: Topology) -> list[str]:
    pcie = "PCIe " + (f"gen{g.pcie_gen} x{g.pcie_width}" if g.pcie_gen and g.pcie_width else "?")
    if g.pcie_max_gen and (g.pcie_max_gen, g.pcie_max_width) != (g.pcie_gen, g.pcie_width):
        pcie += f" (max gen{g.pcie_max_gen} x{g.pcie_max_width})"
    head = "  ".join(x for x in (f"GPU{g.index}", g.name or "?", g.bus_id or "?", g.uuid or "?", g.arch or "",
                                  pcie, f"NUMA {_s(g.numa_node)}") if x)
    out = [head]
    if g.nvlink_count is None:
        out.append("  NVLink: not available")
        return out
    if g.nvlink_count == 0:
        out.append("  NVLink: none (GPU-to-GPU traffic goes over PCIe)")
        return out
    total = g.nvlink_gbps_per_direction
    summary = f"  NVLink: {g.nvlink_count} links, {len(g.up_links)} up"
    if total is not None:
        summary += f", {total:g} GB/s per direction"
    out.append(summary)
    for first, last, lk in _runs(g.links):
        span = f"link {first}" if first == last else f"links {first}-{last}"
        out.append(f"    {span:<12} {_link_text(lk, topo)}")
    return out


def _runs(links: tuple[Link, ...]) -> list[tuple[int, int, Link]]:
    """Consecutive links with the same state, version and far end, as (first, last, one)."""
    runs: list[tuple[int, int, Link]] = []
    for lk in links:
        sig = (lk.state, lk.version, lk.remote, lk.remote_bus_id, lk.remote_gpu, lk.gbps_per_direction)
        if runs:
            first, last, prev = runs[-1]
            psig = (prev.state, prev.version, prev.remote, prev.remote_bus_id, prev.remote_gpu,
                    prev.gbps_per_direction)
            if psig == sig and lk.link == last + 1:
                runs[-1] = (first, lk.link, prev)
                continue
        runs.append((lk.link, lk.link, lk))
    return runs


def _link_text(lk: Link, topo: Topology) -> str:
    state = lk.state or "state?"
    if lk.state == "down":
        return "down"
    version = f"NVLink{lk.version}" if lk.version else "NVLink?"
    if lk.remote == "gpu":
        end = f"GPU{lk.remote_gpu}" if lk.remote_gpu is not None else "GPU (not on this host)"
    elif lk.remote == "nvswitch":
        end = "NVSwitch"
    elif lk.remote == "other":
        end = "other device"
    else:
        end = "remote ?"
    if lk.remote_bus_id:
        end += f" {lk.remote_bus_id}"
    speed = f"{lk.gbps_per_direction:g} GB/s per direction each" if lk.gbps_per_direction else ""
    return "  ".join(x for x in (state, version, f"-> {end}", speed) if x)


def _s(v: object) -> str:
    return "?" if v is None else str(v)

"""The host's GPU topology as plain data: what `commviz topo`, the dashboard and the
tests read. No NVML here — discovery fills it from a backend, and a `topo --json`
document turns back into it, so a topology recorded on a DGX can be drawn anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commviz.topo.ids import normalize_bus_id, normalize_uuid


@dataclass(frozen=True)
class Link:
    """One NVLink of one GPU. Fields NVML could not tell are None."""

    link: int
    state: str | None  # "up" | "down" | None (unknown)
    version: int | None  # NVLink generation: 1..5
    remote: str | None  # "gpu" | "nvswitch" | "other" | None
    remote_bus_id: str | None
    remote_gpu: int | None  # index of the local GPU at the other end, by bus id
    gbps_per_direction: float | None

    @property
    def up(self) -> bool:
        return self.state == "up"

    def to_json(self) -> dict:
        return {"link": self.link, "state": self.state, "version": self.version, "remote": self.remote,
                "remote_bus_id": self.remote_bus_id, "remote_gpu": self.remote_gpu,
                "gbps_per_direction": self.gbps_per_direction}


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML's index on this host (not CUDA's, which CUDA_VISIBLE_DEVICES reorders)
    name: str | None
    uuid: str | None
    bus_id: str | None
    arch: str | None = None
    numa_node: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    nvlink_count: int | None = None  # from NVML's link-count field; None: not available
    links: tuple[Link, ...] = ()

    @property
    def up_links(self) -> tuple[Link, ...]:
        return tuple(lk for lk in self.links if lk.up)

    @property
    def nvlink_gbps_per_direction(self) -> float | None:
        """Nominal NVLink bandwidth of the GPU, one direction, over its up links."""
        rates = [lk.gbps_per_direction for lk in self.up_links]
        if not rates or any(r is None for r in rates):
            return None
        return float(sum(rates))

    def to_json(self) -> dict:
        return {"index": self.index, "name": self.name, "uuid": self.uuid, "bus_id": self.bus_id,
                "arch": self.arch, "numa_node": self.numa_node,
                "pcie": {"gen": self.pcie_gen, "width": self.pcie_width,
                         "max_gen": self.pcie_max_gen, "max_width": self.pcie_max_width},
                "nvlink_count": self.nvlink_count,
                "links": [lk.to_json() for lk in self.links]}


@dataclass(frozen=True)
class Topology:
    """GPUs, their links, and per pair the PCIe/NUMA level and P2P read status.

    ``levels[i][j]`` is the PCIe relationship alone (PIX … SYS, None when unknown);
    the NV# labels of the matrix come from the links, as nvidia-smi does it.
    """

    host: str
    source: str  # "nvml" | "preset:<name>" | "fixture:<file>" | "none"
    gpus: tuple[Gpu, ...] = ()
    levels: tuple[tuple[str | None, ...], ...] = ()
    p2p_read: tuple[tuple[str | None, ...], ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)  # what NVML could not tell, said once

    # ---------------------------------------------------------------- lookups

    def gpu_for(self, uuid: str | None = None, bus_id: str | None = None) -> Gpu | None:
        """The GPU a rank reported, by UUID (either spelling) or PCI bus id; never by index.

        UUID is tried first; a bus id is the fallback for ranks that only know that.
        """
        u = normalize_uuid(uuid)
        if u is not None:
            for g in self.gpus:
                if normalize_uuid(g.uuid) == u:
                    return g
        b = normalize_bus_id(bus_id)
        if b is not None:
            for g in self.gpus:
                if normalize_bus_id(g.bus_id) == b:
                    return g
        return None

    def nvlinks_between(self, i: int, j: int) -> int:
        """Up NVLinks joining GPUs i and j: direct ones, plus, where both reach the
        NVSwitch fabric, the smaller of their switch link counts (one fabric per host,
        as on DGX/HGX boards)."""
        if i == j:
            return 0
        a, b = self.gpus[i], self.gpus[j]
        direct = sum(1 for lk in a.up_links if lk.remote == "gpu" and lk.remote_gpu == j)
        sa = sum(1 for lk in a.up_links if lk.remote == "nvswitch")
        sb = sum(1 for lk in b.up_links if lk.remote == "nvswitch")
        return direct + (min(sa, sb) if sa and sb else 0)

    def label(self, i: int, j: int) -> str:
        """The `nvidia-smi topo -m` cell for GPUs i, j."""
        if i == j:
            return "X"
        nv = self.nvlinks_between(i, j)
        if nv:
            return f"NV{nv}"
        level = self.levels[i][j] if i < len(self.levels) and j < len(self.levels[i]) else None
        return level or "N/A"

    def matrix(self) -> list[list[str]]:
        n = len(self.gpus)
        return [[self.label(i, j) for j in range(n)] for i in range(n)]

    # ---------------------------------------------------------------- documents

    def to_document(self) -> dict:
        """The `commviz topo --json` document (docs/ARCHITECTURE.md), plus additive keys."""
        return {"host": self.host, "source": self.source,
                "gpus": [g.to_json() for g in self.gpus],
                "matrix": self.matrix(),
                "levels": [list(r) for r in self.levels],
                "p2p_read": [list(r) for r in self.p2p_read],
                "notes": list(self.notes)}

    @classmethod
    def from_document(cls, doc: dict) -> "Topology":
        """Back from a `topo --json` document (for replay on a machine without GPUs).

        Only the documented keys are required; ``levels`` missing is rebuilt from the
        matrix's non-NV cells.
        """
        gpus = []
        for g in doc.get("gpus", []):
            pcie = g.get("pcie") or {}
            links = tuple(Link(link=int(lk["link"]), state=lk.get("state"), version=lk.get("version"),
                               remote=lk.get("remote"), remote_bus_id=lk.get("remote_bus_id"),
                               remote_gpu=lk.get("remote_gpu"), gbps_per_direction=lk.get("gbps_per_direction"))
                          for lk in g.get("links", []))
            gpus.append(Gpu(index=int(g["index"]), name=g.get("name"), uuid=g.get("uuid"), bus_id=g.get("bus_id"),
                            arch=g.get("arch"), numa_node=g.get("numa_node"), pcie_gen=pcie.get("gen"),
                            pcie_width=pcie.get("width"), pcie_max_gen=pcie.get("max_gen"),
                            pcie_max_width=pcie.get("max_width"), nvlink_count=g.get("nvlink_count"), links=links))
        levels = doc.get("levels")
        if not levels:
            levels = [[None if (c == "X" or c.startswith("NV") or c == "N/A") else c for c in row]
                      for row in doc.get("matrix", [])]
        p2p = doc.get("p2p_read") or []
        return cls(host=str(doc.get("host", "")), source=str(doc.get("source", "none")), gpus=tuple(gpus),
                   levels=tuple(tuple(r) for r in levels), p2p_read=tuple(tuple(r) for r in p2p),
                   notes=tuple(doc.get("notes", ())))

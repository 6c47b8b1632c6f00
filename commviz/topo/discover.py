"""Backend → `Topology`: ask each item once, resolve link ends by bus id, never raise.

Discovery costs a few hundred NVML calls on an 8-GPU NVSwitch box (milliseconds), so
callers run it once, off the training thread, and keep the result.
"""

from __future__ import annotations

from commviz.topo.backend import NvmlBackend
from commviz.topo.facts import link_gbps
from commviz.topo.ids import normalize_bus_id
from commviz.topo.model import Gpu, Link, Topology


def discover(backend: NvmlBackend) -> Topology:
    """The host's topology as the backend sees it; an unavailable backend gives no GPUs."""
    n = backend.device_count() if backend.available else 0
    bus_ids = [backend.bus_id(i) for i in range(n)]
    by_bus = {b: i for i, b in enumerate(bus_ids) if b}
    gpus = []
    for i in range(n):
        gen, width, max_gen, max_width = backend.pcie_link(i)
        count = backend.nvlink_count(i)
        links = tuple(_link(backend, i, lk, by_bus) for lk in range(count or 0))
        gpus.append(Gpu(index=i, name=backend.name(i), uuid=backend.uuid(i), bus_id=bus_ids[i],
                        arch=backend.arch(i), numa_node=backend.numa_node(i), pcie_gen=gen, pcie_width=width,
                        pcie_max_gen=max_gen, pcie_max_width=max_width, nvlink_count=count, links=links))
    levels: list[list[str | None]] = [[None] * n for _ in range(n)]
    p2p: list[list[str | None]] = [["X" if i == j else None for j in range(n)] for i in range(n)]
    for i in range(n):
        levels[i][i] = "X"
        for j in range(n):
            if i < j:
                levels[i][j] = levels[j][i] = backend.pair_level(i, j)
            if i != j:
                p2p[i][j] = backend.p2p_read(i, j)
    if all(p2p[i][j] is None for i in range(n) for j in range(n) if i != j):
        p2p = []  # not available at all: say nothing rather than a matrix of blanks
    return Topology(host=backend.host, source=backend.source, gpus=tuple(gpus),
                    levels=tuple(tuple(r) for r in levels), p2p_read=tuple(tuple(r) for r in p2p),
                    notes=tuple(backend.notes))


def _link(backend: NvmlBackend, i: int, link: int, by_bus: dict[str, int]) -> Link:
    up = backend.nvlink_state(i, link)
    if up is False:
        # A down link's far end is not reported reliably; don't ask, don't guess.
        return Link(link=link, state="down", version=None, remote=None, remote_bus_id=None, remote_gpu=None,
                    gbps_per_direction=None)
    version = backend.nvlink_version(i, link)
    remote_bus = normalize_bus_id(backend.nvlink_remote_bus_id(i, link))
    remote = backend.nvlink_remote_type(i, link)
    remote_gpu = by_bus.get(remote_bus) if remote_bus else None
    if remote is None and remote_bus is not None:
        # No device-type API (old driver): a bus id that is one of our GPUs is a GPU.
        remote = "gpu" if remote_gpu is not None else "other"
    if remote != "gpu":
        remote_gpu = None
    return Link(link=link, state=None if up is None else "up", version=version, remote=remote,
                remote_bus_id=remote_bus, remote_gpu=remote_gpu, gbps_per_direction=link_gbps(version))

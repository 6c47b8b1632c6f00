"""Which topology a rank's GPU is looked up in: its own host's.

Each host's local rank 0 sends its host's topology document (events.HostTopology).
A rank on host B is placed on B's GPUs, found by its UUID or bus id; the watcher's
own NVML view only describes the watcher's host, so it is used for ranks on that
host alone. A preset or fixture (`--topology`) describes a machine, not a host, and
stands for every host that sent nothing.
"""

from __future__ import annotations

from commviz.topo.model import Gpu, Topology


class HostTopologies:
    def __init__(self, local: Topology | None = None) -> None:
        self.local = local  # what the watcher was given: its NVML view, or a preset
        self.by_host: dict[str, Topology] = {}
        self.bad = 0  # documents that could not be read (counted, never raised)

    def add(self, host: str, document: dict) -> None:
        try:
            self.by_host[host] = Topology.from_document(document)
        except Exception:
            self.bad += 1

    def for_host(self, host: str) -> Topology | None:
        t = self.by_host.get(host)
        if t is not None:
            return t
        local = self.local
        if local is None:
            return None
        if local.source == "nvml":
            return local if local.host == host else None
        return local  # a preset or fixture: the layout asked for, on every host

    def gpu_of(self, hello) -> Gpu | None:
        """The GPU a rank said it uses, in its own host's topology; None if unknown."""
        if hello is None:
            return None
        t = self.for_host(hello.host)
        return t.gpu_for(uuid=hello.cuda_uuid, bus_id=hello.pci_bus_id) if t is not None else None

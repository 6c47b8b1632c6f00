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
        self.version = -1  # the model's topology_version last synced
        self._docs: dict[str, dict] = {}  # the document each host's topology was read from

    def sync(self, documents: dict[str, dict], version: int) -> None:
        """Take the model's documents (`Model.host_topologies`) when they changed
        (`Model.topology_version`): read under the feed's lock, parsed once per host
        and document, not per snapshot."""
        if version == self.version:
            return
        self.version = version
        for host, doc in documents.items():
            if self._docs.get(host) is not doc:
                self._docs[host] = doc
                self.add(host, doc)

    def add(self, host: str, document: dict) -> None:
        try:
            t = Topology.from_document(document)
            if [g.index for g in t.gpus] != list(range(len(t.gpus))):
                raise ValueError("GPU indices are not 0..n-1 in order")  # links are looked up by position
            self.by_host[host] = t
        except Exception:
            self.by_host.pop(host, None)
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

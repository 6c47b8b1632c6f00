"""What NCCL itself says a rank ran (its profiler plugin's `NcclComm` and `NcclOp`
events): per communicator and NCCL function, how many ops, bytes, GPU time and
graph replays. Kept apart from the probe's own per-op counts on purpose: NCCL sees
what no Python wrapper saw (C++ comm hooks, vLLM's ctypes calls, CUDA-graph replays),
and where both saw an op the two counts are two witnesses, not one number."""

from __future__ import annotations

from dataclasses import dataclass, field

from commviz.events import NcclComm, NcclOp


@dataclass
class CommInfo:
    rank: int
    nranks: int
    nodes: int
    name: str
    ended: bool = False


@dataclass
class FuncTally:
    count: int = 0  # ops NCCL ran, each replay of a captured op included
    bytes: int = 0
    device_ns: int = 0  # summed GPU time of those that reported it
    timed: int = 0  # how many reported it
    captured: int = 0  # ops captured into a CUDA graph
    replays: int = 0  # their replays

    def document(self) -> dict:
        doc = {"count": self.count, "bytes": self.bytes}
        if self.timed:
            doc["device_ns"] = self.device_ns
            doc["timed"] = self.timed
        if self.captured:
            doc["captured"] = self.captured
            doc["replays"] = self.replays
        return doc


@dataclass
class NcclTally:
    comms: dict[str, CommInfo] = field(default_factory=dict)
    funcs: dict[tuple[str, str], FuncTally] = field(default_factory=dict)  # (comm, func) ->

    def add(self, ev: NcclComm | NcclOp) -> None:
        if type(ev) is NcclComm:
            if ev.ended:
                known = self.comms.get(ev.comm)
                if known is not None:
                    known.ended = True
            else:
                self.comms[ev.comm] = CommInfo(ev.rank, ev.nranks, ev.nodes, ev.name)
            return
        f = self.funcs.get((ev.comm, ev.func))
        if f is None:
            f = self.funcs[(ev.comm, ev.func)] = FuncTally()
        if ev.captured and ev.replays == 0:  # the capture: no data moved yet
            f.captured += 1
            return
        f.count += 1
        f.replays += ev.replays
        if ev.bytes > 0:
            f.bytes += ev.bytes
        if ev.device_ns >= 0:
            f.device_ns += ev.device_ns
            f.timed += 1

    def document(self) -> dict:
        """Per communicator: who this rank is in it, and NCCL's counts by function."""
        out = {}
        for comm in sorted(set(self.comms) | {c for c, _ in self.funcs}):
            info = self.comms.get(comm)
            doc: dict = {} if info is None else {"rank": info.rank, "nranks": info.nranks, "nodes": info.nodes}
            if info is not None and info.name:
                doc["name"] = info.name
            if info is not None and info.ended:
                doc["ended"] = True
            doc["ops"] = {func: t.document() for (c, func), t in sorted(self.funcs.items()) if c == comm}
            out[comm] = doc
        return out

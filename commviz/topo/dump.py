"""Topology and counters from a backend → a fixture document (`commviz nvml-dump`).

A fixture written on a real machine replays that machine exactly in tests and on
machines without GPUs; the counter capture lets tests check rates on real numbers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from commviz.topo.backend import NvmlBackend
from commviz.topo.discover import discover
from commviz.topo.fake import FORMAT, VERSION
from commviz.topo.model import Topology


def fixture_from(backend: NvmlBackend, samples: int = 3, interval_s: float = 0.2,
                 sleep: Callable[[float], None] = time.sleep) -> dict:
    """Describe the backend's machine as a fixture, with ``samples`` counter readings
    ``interval_s`` apart (0 samples: topology only)."""
    topo = discover(backend)
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "host": topo.host,
                           "description": f"captured by `commviz nvml-dump` from {topo.source} on {topo.host}",
                           "captured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                           "gpus": [_gpu(g, backend.memory(g.index)) for g in topo.gpus],
                           "levels": [list(r) for r in topo.levels]}
    if topo.p2p_read:
        doc["p2p_read"] = [list(r) for r in topo.p2p_read]
    unsupported: set[str] = set()
    if samples > 0 and topo.gpus:
        doc["counters"], doc["samples"] = _capture(backend, topo, samples, interval_s, sleep, unsupported)
    if unsupported:
        doc["unsupported"] = sorted(unsupported)
    if backend.notes:
        doc["notes"] = list(backend.notes)  # what this machine's NVML could not tell
    return doc


def _gpu(g, memory: tuple[int, int] | None) -> dict:
    return {"index": g.index, "name": g.name, "uuid": g.uuid, "bus_id": g.bus_id, "arch": g.arch,
            "numa_node": g.numa_node,
            "pcie": {"gen": g.pcie_gen, "width": g.pcie_width, "max_gen": g.pcie_max_gen,
                     "max_width": g.pcie_max_width},
            "memory_total": None if memory is None else memory[1], "nvlink_count": g.nvlink_count,
            "links": [{"link": lk.link, "state": lk.state, "version": lk.version, "remote": lk.remote,
                       "remote_bus_id": lk.remote_bus_id} for lk in g.links]}


def _capture(backend: NvmlBackend, topo: Topology, samples: int, interval_s: float,
             sleep: Callable[[float], None], unsupported: set[str]) -> tuple[dict, dict]:
    t_us: list[int] = []
    counters: dict[str, dict] = {}
    extra: dict[str, dict] = {}
    for k in range(samples):
        if k:
            sleep(interval_s)
        stamp = None
        for g in topo.gpus:
            links = [lk.link for lk in g.up_links]
            got = backend.counters(g.index, links)
            c = counters.setdefault(str(g.index), {"nvlink": {}, "pcie": {"tx_bytes": [], "rx_bytes": []}})
            for link in links:
                per = c["nvlink"].setdefault(str(link), {"tx_kib": [], "rx_kib": []})
                for d in ("tx", "rx"):
                    v = got.get(f"nvlink{link}.{d}")
                    per[f"{d}_kib"].append(None if v is None else v[0] // 1024)
                    stamp = stamp or (v[1] if v else None)
            for d in ("tx", "rx"):
                v = got.get(f"pcie.{d}")
                c["pcie"][f"{d}_bytes"].append(None if v is None else v[0])
                stamp = stamp or (v[1] if v else None)
            e = extra.setdefault(str(g.index), {"util": [], "mem_util": [], "mem_used": []})
            u = backend.utilization(g.index)
            e["util"].append(None if u is None else u[0])
            e["mem_util"].append(None if u is None else u[1])
            m = backend.memory(g.index)
            e["mem_used"].append(None if m is None else m[0])
        t_us.append(stamp if stamp is not None else int(time.time() * 1e6))
    for gi, c in counters.items():
        if all(v is None for per in c["nvlink"].values() for s in per.values() for v in s) and c["nvlink"]:
            unsupported.add(f"gpu{gi}:nvlink_counters")
        if all(v is None for s in c["pcie"].values() for v in s):
            unsupported.add(f"gpu{gi}:pcie_counters")
    for gi, e in extra.items():
        if all(v is None for v in e["util"]):
            unsupported.add(f"gpu{gi}:utilization")
        if all(v is None for v in e["mem_used"]):
            unsupported.add(f"gpu{gi}:memory")
    return {"t_us": t_us, "gpus": counters}, {"gpus": extra}


def fixture_text(doc: Any, width: int = 110) -> str:
    """JSON that reads as a table: anything that fits on a line stays on one."""
    return _fmt(doc, 0, width) + "\n"


def _fmt(v: Any, indent: int, width: int) -> str:
    flat = json.dumps(v)
    if len(flat) + indent <= width or not isinstance(v, (dict, list)) or not v:
        return flat
    pad = " " * (indent + 2)
    if isinstance(v, dict):
        items = [f"{pad}{json.dumps(k)}: {_fmt(x, indent + 2, width)}" for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + _fmt(x, indent + 2, width) for x in v]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"

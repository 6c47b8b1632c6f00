"""What placing every host's ranks on their own host's topology costs the dashboard:
CPU time of one snapshot (`take_snapshot`, taken under the feed's lock) and of the
Links panel's rows (`link_rows`, on the UI thread), for a GPU job of H hosts × 8 GPUs
where every host's local rank 0 sent its topology document (the dgx-h100 preset's).

    python bench/snapshot_hosts.py [--hosts 8,128] [--repeat 20]

Rows: "one topology" maps every host on the watcher's (what the dashboard did before
per-host documents were used; on a tree without them it is the only row), "per host"
reads each host's own document (`topo.hosts.HostTopologies`). CPU time
(`time.process_time`), median and minimum of the repeats, the rows of one world size
timed in turn each round; compare rows of one run.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commviz.events import GroupDef, Hello, OpEnd, OpStart  # noqa: E402
from commviz.model.state import Model  # noqa: E402
from commviz.topo.discover import discover  # noqa: E402
from commviz.topo.presets import load_preset  # noqa: E402
from commviz.view.snapshot import take_snapshot  # noqa: E402
from commviz.tui.widgets.links import link_rows  # noqa: E402

WALL0 = 1_700_000_000_000_000_000
MS = 1_000_000
PER_HOST = 8


def job(hosts: int, preset) -> tuple[Model, int]:
    world = hosts * PER_HOST
    m = Model()
    for r in range(world):
        local = r % PER_HOST
        m.ingest(r, Hello(rank=r, local_rank=local, world_size=world, host=f"node{r // PER_HOST}", pid=1000 + r,
                          backend="nccl", device=f"cuda:{local}", torch_version="2.13.0", commviz_version="0",
                          job="bench", mono_ns=WALL0, wall_ns=WALL0, cuda_uuid=preset.gpus[local].uuid))
        m.ingest(r, GroupDef("0", list(range(world)), "nccl"))
    try:
        from commviz.events import HostTopology

        doc = preset.to_document()
        for h in range(hosts):
            m.ingest(h * PER_HOST, HostTopology(WALL0, f"node{h}", dict(doc, host=f"node{h}", source="nvml")))
    except ImportError:  # a tree without per-host documents
        pass
    t = WALL0 + 1000 * MS
    for i in range(40):
        for r in range(world):
            m.ingest(r, OpStart(id=i, t=t + i * 20 * MS, op="all_reduce", group="0", seq=i, bytes=64 << 20))
        for r in range(world):
            m.ingest(r, OpEnd(id=i, t=t + i * 20 * MS + 5 * MS))
    return m, t + 40 * 20 * MS


def cpu_us(fns: list, repeat: int) -> list[tuple[float, float]]:
    """(median, min) CPU µs of each fn, the fns taken in turn each round so that load
    from other processes falls on all of them alike."""
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for k, fn in enumerate(fns):
            c0 = time.process_time()
            fn()
            out[k].append((time.process_time() - c0) * 1e6)
    return [(statistics.median(x), min(x)) for x in out]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", default="8,128")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    preset = discover(load_preset("dgx-h100"))
    per_host = "hosts" in inspect.signature(take_snapshot).parameters
    for hosts in [int(x) for x in args.hosts.split(",")]:
        m, now = job(hosts, preset)
        ways = [("one topology", {})]
        if per_host:
            from commviz.topo.hosts import HostTopologies

            ways.append(("per host", {"hosts": HostTopologies(local=preset)}))
        fns, names = [], []
        for name, kw in ways:
            snap = take_snapshot(m, now, topology=preset, **kw)  # warm: documents parsed once, here
            tops = getattr(snap, "topologies", None)
            extra = {"topologies": tops} if tops is not None and per_host else {}
            fns.append(lambda kw=kw: take_snapshot(m, now, topology=preset, **kw))
            fns.append(lambda snap=snap, extra=extra: link_rows(snap.rates, snap.places, preset, snap.samples,
                                                                 None, **extra))
            names.append(name)
        got = cpu_us(fns, args.repeat)
        for k, name in enumerate(names):
            (s_med, s_min), (r_med, r_min) = got[2 * k], got[2 * k + 1]
            print(f"{hosts * PER_HOST:5d} ranks on {hosts:3d} hosts · {name:12s}: snapshot {s_med:8,.0f} µs CPU "
                  f"(min {s_min:,.0f}), links rows {r_med:6,.0f} µs CPU (min {r_min:,.0f})")


if __name__ == "__main__":
    main()

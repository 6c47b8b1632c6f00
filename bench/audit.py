"""What the audit costs: reading torch's flight recorder with N entries (the rank
side, `probe.audit.read`: dump as JSON + parse) and comparing them with the rank's
events (the watcher side, `model.audit.compare`). One process, gloo, world size 1.
Neither runs per op: at exit and when an op passes the stack threshold.

    python bench/audit.py [--entries 2000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(args.entries)  # before torch creates the recorder

    import torch
    import torch.distributed as dist

    from commviz.events import GroupDef, Hello, OpEnd, OpStart
    from commviz.model import Model
    from commviz.probe.audit import read

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    m = Model()
    m.ingest(0, Hello(0, 0, 1, "h", os.getpid(), "gloo", "cpu", torch.__version__, "", "bench",
                      time.monotonic_ns(), time.time_ns()))
    m.ingest(0, GroupDef("0", [0], "gloo"))
    x = torch.ones(16)
    for i in range(args.entries):
        t0 = time.monotonic_ns()
        dist.all_reduce(x)
        m.ingest(0, OpStart(i, t0, "all_reduce", "0", i, 64))
        m.ingest(0, OpEnd(i, time.monotonic_ns()))
    import json

    import torch._C._distributed_c10d as c10d

    dumps, parses = [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        raw = c10d._dump_fr_trace_json(True, False)
        t1 = time.perf_counter()
        json.loads(raw)
        dumps.append(t1 - t0)
        parses.append(time.perf_counter() - t1)
    reads, compares = [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        a = read("gloo")
        t1 = time.perf_counter()
        m.ingest(0, a)
        compares.append(time.perf_counter() - t1)
        reads.append(t1 - t0)
    audit = m.ranks[0].audit
    assert audit.get("unseen") == {} and audit["backend"] == {"all_reduce": args.entries}, audit
    dist.destroy_process_group()
    print(f"torch's dump alone: {statistics.median(dumps) * 1e3:.1f} ms; json parse: "
          f"{statistics.median(parses) * 1e3:.1f} ms ({len(raw)} bytes)")
    print(f"compare with the model: {statistics.median(compares) * 1e3:.1f} ms for {args.entries} entries")
    print(f"read on the rank (dump + parse): {statistics.median(reads) * 1e3:.1f} ms for {args.entries} entries")


if __name__ == "__main__":
    main()

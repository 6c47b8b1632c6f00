"""Does NCCL still overlap with compute under commviz, with CUDA_DEVICE_MAX_CONNECTIONS=1?
(issue 50, item 3). Megatron and Transformer Engine set that variable; with one
hardware queue, an event or a stream wait put in at the wrong place serializes NCCL
behind compute (pytorch#143890), and commviz records events around every op.

    torchrun --standalone --nproc-per-node 2 bench/gpu_overlap.py [--share] [--rounds 8] [--steps 10] [--dry-run]

A step, as a data-parallel step overlaps its gradient all_reduce: the all_reduce of
--ar-mib on a stream of its own (async), --matmuls matmuls of --size on the default
stream, then the default stream waits for the all_reduce. Blocks of --steps steps,
bare (commviz suspended) and instrumented, interleaved in rounds (which goes first
alternates), the device synchronized around each block, never inside: the step-time
ratio is the median over rounds. Outside the timed blocks, a few steps are run with
CUDA events of the bench's own (the all_reduce's interval on its stream, from before
its launch to after its end, and the matmuls' on theirs, all from one reference event):
the overlap is the time the two intervals share over the shorter of them, bare and
instrumented, and each part alone gives the serialized step for comparison.

--share: several ranks on one GPU (bench/gpushare.py's variables; bench/gpu_check.sh
passes it where bench/nccl_share.py found that works). At world size 1 NCCL launches
no kernel for an all_reduce (a copy, or nothing in place), so there is no overlap to
measure: it says so and gives the ratio alone. One JSON line (rank 0). `--dry-run`:
gloo on the CPU, tiny sizes, no device times: rehearses the script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_step import instrumented_vs_bare, warm_up  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--size", type=int, default=4096, help="matmul side")
    ap.add_argument("--matmuls", type=int, default=8)
    ap.add_argument("--ar-mib", type=float, default=16.0, help="MiB all_reduced per step")
    ap.add_argument("--share", action="store_true", help="several ranks on one GPU (bench/gpushare.py)")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # before CUDA starts
    if args.share:
        import gpushare

        gpushare.apply()
    os.environ.setdefault("COMMVIZ_ADDR", f"ipc://{tempfile.mkdtemp()}/nobody.sock")  # no watcher: sends dropped
    import torch
    import torch.distributed as dist

    import commviz
    from commviz.probe.patch import suspended

    assert commviz.instrument() is not None, "commviz is off (COMMVIZ=0?)"
    cuda = not args.dry_run
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.dry_run:
        args.size, args.matmuls, args.ar_mib = 128, 2, 0.25
        dev = torch.device("cpu")
    else:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    x = torch.randn(args.size, args.size, device=dev) / args.size ** 0.5
    g = torch.ones(int(args.ar_mib * (1 << 20)) // 4, device=dev)
    comm = torch.cuda.Stream(device=dev) if cuda else None

    def matmuls():
        y = x
        for _ in range(args.matmuls):
            y = y @ x
        return y

    def step(ev=None):
        """One step; with `ev`, the bench's own events around its parts."""
        if not cuda:
            work = dist.all_reduce(g, async_op=True)
            matmuls()
            work.wait()
            return
        cur = torch.cuda.current_stream()
        if ev:
            ev["z"].record(cur)
        comm.wait_stream(cur)
        with torch.cuda.stream(comm):
            if ev:
                ev["a0"].record(comm)
            work = dist.all_reduce(g, async_op=True)
        if ev:
            ev["m0"].record(cur)
        matmuls()
        if ev:
            ev["m1"].record(cur)
        with torch.cuda.stream(comm):  # enqueued after the matmuls: the wait holds nothing up
            work.wait()
            if ev:
                ev["a1"].record(comm)
        cur.wait_stream(comm)

    def block() -> float:
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(args.steps):
            step()
        sync()
        return (time.perf_counter_ns() - t0) / args.steps / 1e6

    def overlap(n: int = 5) -> dict:
        """Median over n steps: the all_reduce's and the matmuls' ms, and the share of
        the shorter that the two intervals have in common."""
        fr, ar, mm = [], [], []
        for _ in range(n):
            ev = {k: torch.cuda.Event(enable_timing=True) for k in ("z", "a0", "a1", "m0", "m1")}
            step(ev)
            sync()
            at = {k: ev["z"].elapsed_time(e) for k, e in ev.items() if k != "z"}
            a, m = at["a1"] - at["a0"], at["m1"] - at["m0"]
            common = max(0.0, min(at["a1"], at["m1"]) - max(at["a0"], at["m0"]))
            fr.append(common / max(1e-9, min(a, m)))
            ar.append(a)
            mm.append(m)
        return {"overlap": round(statistics.median(fr), 3), "all_reduce_ms": round(statistics.median(ar), 3),
                "matmuls_ms": round(statistics.median(mm), 3)}

    def alone(fn, n: int = 5) -> float:
        ts = []
        for _ in range(n):
            sync()
            t0 = time.perf_counter_ns()
            fn()
            sync()
            ts.append((time.perf_counter_ns() - t0) / 1e6)
        return round(statistics.median(ts), 3)

    warm_up(block, suspended)  # communicator, cuBLAS, the probe's event pool
    out: dict = {"fact": "gpu_overlap", "dry_run": args.dry_run, "world": world,
                 "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                 "shape": {"matmuls": args.matmuls, "size": args.size, "all_reduce_mib": args.ar_mib,
                           "steps": args.steps, "rounds": args.rounds},
                 **instrumented_vs_bare(block, suspended, args.rounds)}
    if not cuda:
        out["overlap"] = "skipped: no device times on the CPU (dry run)"
    elif world == 1:
        out["overlap"] = "skipped: at world size 1 NCCL launches no kernel for an all_reduce"
    else:
        with suspended():
            out["bare"] = overlap()
            out["all_reduce_alone_ms"] = alone(lambda: dist.all_reduce(g))
            out["matmuls_alone_ms"] = alone(matmuls)
        out["instrumented"] = overlap()
        out["gpu"] = torch.cuda.get_device_name(dev)
    if rank == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

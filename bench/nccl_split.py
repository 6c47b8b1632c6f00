"""Where the host time the probe adds to an NCCL launch goes (bench/nccl_launch.py
gives the total): the same interleaved blocks of launches, with the probe's CUDA
poller as it is, with the poller woken by every launch (as it was), and with no
poller at all (ends kept aside, their events recycled after the block); then the CUDA calls the
caller's thread makes per op, one at a time. Run on one GPU by bench/gpu_check.sh:

    torchrun --standalone --nproc-per-node 1 bench/nccl_split.py [--rounds 10] [--dry-run]

Each line is the median over rounds of µs per launch above the bare launch of the
same round. `--dry-run` (gloo, CPU) rehearses the script: the CUDA rows say skipped.
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

from nccl_launch import launches  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--numel", type=int, default=1 << 20)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("COMMVIZ_ADDR", f"ipc://{tempfile.mkdtemp()}/nobody.sock")  # no watcher: sends dropped
    import torch
    import torch.distributed as dist

    import commviz
    from commviz.probe.patch import current, suspended

    probe = commviz.instrument()
    assert probe is not None, "commviz is off (COMMVIZ=0?)"
    dist.init_process_group("gloo" if args.dry_run else "nccl")
    dev = torch.device("cpu") if args.dry_run else torch.device("cuda", 0)
    x = torch.ones(args.numel, device=dev)
    sync = (lambda: None) if args.dry_run else torch.cuda.synchronize

    def block() -> float:
        return launches(dist.all_reduce, x, args.calls, sync)

    side = current().cuda_side
    results: dict[str, object] = {"fact": "nccl_split", "dry_run": args.dry_run}

    def bare() -> float:
        with suspended():
            return block()

    def variant(name: str, setup=None, teardown=None) -> None:
        added = []
        for _ in range(args.rounds):
            b = bare()
            undo = setup() if setup else None
            p = block()
            if teardown:
                teardown(undo)
            added.append(p - b)
        results[name] = round(statistics.median(added) / 1e3, 2)

    for _ in range(3):
        block()
        bare()
    results["bare_us"] = round(statistics.median(bare() for _ in range(args.rounds)) / 1e3, 2)
    variant("probe_us")
    if side is not None and side.poller is not None:
        poller = side.poller

        def wake_per_op():  # the poller as it was before 2026-12-04: woken by every launch
            add = poller.add

            def add_and_wake(p, add=add):
                add(p)
                poller.backoff.reset()
                poller.wake()
            poller.add = add_and_wake

        variant("probe_wake_per_op_us", wake_per_op, lambda _: poller.__dict__.pop("add", None))
        sink: list = []

        def park():
            side.poll = sink.append

        def unpark(_):
            del side.poll
            sync()
            for p in sink:
                for ev in (p.start, p.end):
                    if ev is not None:
                        side.recycle(p.dev, ev)
            sink.clear()

        variant("probe_no_poller_us", park, unpark)
    else:
        results["poller"] = "none started (no CUDA ops polled)"
    if not args.dry_run:
        n = args.calls * 20

        def each(name, fn):
            fn()
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            results[name] = round((time.perf_counter_ns() - t0) / n / 1e3, 3)

        s = torch.cuda.current_stream(dev)
        ev = torch.cuda.Event(enable_timing=True)
        each("x.get_device", x.get_device)
        each("cuda.current_device", torch.cuda.current_device)
        each("cuda.is_current_stream_capturing", torch.cuda.is_current_stream_capturing)
        each("cuda.current_stream(dev)", lambda: torch.cuda.current_stream(0))
        if side is not None:
            each("side.current_stream(dev)", lambda: side.current_stream(0))
        each("Event.record(stream)", lambda: ev.record(s))
        each("Event(enable_timing)+record", lambda: torch.cuda.Event(enable_timing=True).record(s))
        each("Event.query", ev.query)
        if side is not None:
            each("side.begin", lambda: side.begin(x))
        sync()
    recorded = next(current().ids)
    results["op_ids"] = recorded
    print(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""What commviz costs a DDP training step on a GPU: the step's wall time, bare and
instrumented, blocks interleaved in rounds (noise hits both alike). Two models: one
where the GPU's work hides the probe's host time (what a real step looks like), and
a small one where launching is all there is (the worst case). Run on one GPU by
bench/gpu_check.sh:

    torchrun --standalone --nproc-per-node 1 bench/gpu_step.py [--rounds 8] [--dry-run]

One JSON line: per model, its collectives per step, the bare step's ms and the
instrumented step's ratio to it (median over rounds; which block goes first
alternates by round). No watcher listens: the probe's sends are refused at its
socket, so this is the cost inside the job, not a watcher's. `--dry-run`: gloo on
the CPU, tiny models, to rehearse the script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def warm_up(block, suspended) -> None:
    """Two blocks each way, untimed: what the first ones set up is not a step's cost."""
    for _ in range(2):
        block()
        with suspended():
            block()


def instrumented_vs_bare(block, suspended, rounds: int) -> dict:
    """`block()` (a timed run of steps, ms a step) with the probe on and off
    (`suspended`), `rounds` times, which goes first alternating by round: the bare
    step's median ms, the instrumented step's median ratio to it and the ratios'
    spread. bench/gpu_overlap.py times its steps the same way."""
    bare, ratio = [], []
    for k in range(rounds):
        if k % 2:
            p = block()
        with suspended():
            b = block()
        if not k % 2:
            p = block()
        bare.append(b)
        ratio.append(p / b)
    return {"bare_step_ms": round(statistics.median(bare), 3), "instrumented_ratio": round(statistics.median(ratio), 4),
            "ratio_spread": [round(min(ratio), 4), round(max(ratio), 4)]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("COMMVIZ_ADDR", f"ipc://{tempfile.mkdtemp()}/nobody.sock")  # no watcher: sends dropped
    import torch
    import torch.distributed as dist

    import commviz
    from commviz.probe.patch import current, suspended

    assert commviz.instrument() is not None, "commviz is off (COMMVIZ=0?)"
    dist.init_process_group("gloo" if args.dry_run else "nccl")
    dev = torch.device("cpu") if args.dry_run else torch.device("cuda", 0)
    sync = (lambda: None) if args.dry_run else torch.cuda.synchronize
    # (name, width, layers, batch, bucket MB): GPU-bound and launch-bound
    shapes = [("gpu_bound", 4096, 8, 256, 25), ("launch_bound", 256, 16, 32, 0.25)]
    if args.dry_run:
        shapes = [(n, 64, 2, 8, 0.01) for n, *_ in shapes]
    out: dict[str, object] = {"fact": "gpu_step", "dry_run": args.dry_run}
    for name, width, layers, batch, bucket_mb in shapes:
        torch.manual_seed(0)
        net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(dev)
        model = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=None if args.dry_run else [0], bucket_cap_mb=bucket_mb)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        x = torch.randn(batch, width, device=dev)

        def block() -> float:
            sync()
            t0 = time.perf_counter_ns()
            for _ in range(args.steps):
                opt.zero_grad(set_to_none=True)
                model(x).square().mean().backward()
                opt.step()
            sync()
            return (time.perf_counter_ns() - t0) / args.steps / 1e6

        warm_up(block, suspended)  # communicator, bucket rebuild, caches
        first = next(current().ids)
        timed = instrumented_vs_bare(block, suspended, args.rounds)
        ops = (next(current().ids) - first - 1) / (args.rounds * args.steps)
        out[name] = {"collectives_per_step": round(ops, 1), **timed}
    print(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""all_reduce, the collective behind data-parallel training: every rank contributes
a tensor and every rank ends with the element-wise sum.

    torchrun --nproc-per-node 4 scenarios/allreduce.py --iters 50 --numel 1024

Each rank fills its tensor with rank+1, so after the sum every element must be
n(n+1)/2; the script checks that and fails loudly if not. It calls
commviz.instrument(), so a running `commviz watch` shows it live.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

try:
    import commviz

    commviz.instrument()
except ImportError:  # the lesson still runs without commviz installed
    commviz = None

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--numel", type=int, default=1 << 20, help="elements per tensor (default 1M)")
    p.add_argument("--iters", type=int, default=20, help="all_reduce calls (default 20)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--interval", type=float, default=0.0, help="seconds to pause between steps, to watch")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dtype = DTYPES[args.dtype]
    expected = world * (world + 1) / 2
    if rank == 0:
        nbytes = args.numel * torch.tensor([], dtype=dtype).element_size()
        print(f"all_reduce: {world} ranks sum {nbytes} bytes each, {args.iters} times, on {dist.get_backend()}")
    t = torch.empty(args.numel, dtype=dtype, device=device)
    start = time.perf_counter()
    for i in range(args.iters):
        t.fill_(rank + 1)
        dist.all_reduce(t)
        if not torch.all(t == expected):
            print(f"rank {rank}: step {i}: wrong sum {t[0].item()}, expected {expected}", file=sys.stderr)
            return 1
        if commviz is not None and i % 10 == 0:
            commviz.mark(f"step {i}")
        if args.interval:
            time.sleep(args.interval)
    if use_cuda:
        torch.cuda.synchronize()  # the lesson's own timing, not the probe's
    per_call_us = (time.perf_counter() - start) / max(1, args.iters) * 1e6
    if rank == 0:
        print(f"all_reduce: ok, every element is {expected:g} on every rank ({per_call_us:.1f} µs per step)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

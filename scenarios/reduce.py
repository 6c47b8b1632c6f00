"""reduce to a root with SUM, MIN and MAX, then all_reduce for comparison.

    torchrun --nproc-per-node 4 scenarios/reduce.py --interval 0.2

Each step every rank contributes a tensor (element j is j mod 7 + rank); reduce
combines them element-wise on one root (rank step mod n, so the root moves around),
once per reduction op. Only the root receives the result: a reduce's busbw factor is
1, where all_reduce, which leaves the result on every rank, costs 2(n-1)/n. The root
checks every reduce; every rank checks the all_reduce.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _common import DTYPES, check, init, mark, parser, pause, say

OPS = {"sum": (dist.ReduceOp.SUM, lambda s: s.sum(0)), "min": (dist.ReduceOp.MIN, lambda s: s.amin(0)),
       "max": (dist.ReduceOp.MAX, lambda s: s.amax(0))}


def contribution(r: int, numel: int, dtype, device) -> torch.Tensor:
    return (torch.arange(numel) % 7 + r).to(dtype=dtype, device=device)


def main() -> int:
    p = parser(__doc__, numel=1 << 16, iters=10)
    args = p.parse_args()
    rank, world, device = init()
    dtype = DTYPES[args.dtype]
    say(rank, f"reduce: sum, min and max of {world} ranks' tensors to one root each step, then all_reduce (sum) "
              f"to every rank")
    x = contribution(rank, args.numel, dtype, device)
    everyone = torch.stack([contribution(r, args.numel, dtype, device) for r in range(world)])
    for i in range(args.iters):
        root = i % world
        mark(f"step {i}: reduce to rank {root}")
        for name, (op, local) in OPS.items():
            t = x.clone()
            dist.reduce(t, dst=root, op=op)
            if rank == root:
                check(rank, f"step {i}: reduce {name} on root {root}", t, local(everyone))
        t = x.clone()
        dist.all_reduce(t)
        check(rank, f"step {i}: all_reduce sum", t, everyone.sum(0))
        pause(args)
    say(rank, "reduce: ok, each root got the sum, min and max; all_reduce gave every rank the sum")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

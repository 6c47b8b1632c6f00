"""A desync: ranks call the same collective with different arguments.

--mismatch shape : the last rank passes a tensor of another size
--mismatch dtype : the last rank passes float64 instead of float32
--mismatch op    : the last rank calls broadcast where the others call all_reduce

On gloo a shape or dtype mismatch aborts a rank within milliseconds; an op
mismatch hangs. commviz names who differs from whom, and how.

    commviz record -o desync.cvz --hang-timeout 5 -- torchrun --nproc-per-node 2 scenarios/desync.py --mismatch op
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _common import init, parser, say


def main() -> int:
    p = parser(__doc__, numel=1024, iters=3)
    p.add_argument("--mismatch", choices=["shape", "dtype", "op"], default="op")
    args = p.parse_args()
    rank, world, device = init()
    odd = rank == world - 1
    say(rank, f"desync: rank {world - 1} calls step {args.iters - 1} with a different {args.mismatch}")
    for i in range(args.iters):
        t = torch.ones(args.numel, device=device)
        if i == args.iters - 1 and odd:
            if args.mismatch == "shape":
                t = torch.ones(args.numel * 2, device=device)
            elif args.mismatch == "dtype":
                t = torch.ones(args.numel, dtype=torch.float64, device=device)
            else:
                dist.broadcast(t, src=0)
                continue
        dist.all_reduce(t)
    say(rank, "desync: finished (no desync?)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

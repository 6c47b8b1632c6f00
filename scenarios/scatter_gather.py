"""scatter and gather: a root splits a batch among the ranks, each works on its
slice, and the root gathers the results back.

    torchrun --nproc-per-node 4 scenarios/scatter_gather.py --interval 0.2

Each step the root (rank 0) holds a batch of n × `--numel` elements; scatter gives
rank r the r-th slice, rank r adds r + 1 to it (its "work"), and gather brings the
n results back to the root, which checks every element. Both ops count n × numel
elements in commviz's bytes (the whole batch) on every rank, with busbw factor (n-1)/n:
the root's own slice never crosses a link.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _common import DTYPES, check, human, init, mark, parser, pause, say

ROOT = 0


def batch(step: int, world: int, numel: int, dtype, device) -> torch.Tensor:
    """The full batch, (world, numel): small integers, exact in every dtype."""
    return ((torch.arange(world * numel) % 97 + step % 50).reshape(world, numel)).to(dtype=dtype, device=device)


def main() -> int:
    p = parser(__doc__, numel=1 << 14, iters=10, numel_help="elements per rank's slice")
    args = p.parse_args()
    rank, world, device = init()
    dtype = DTYPES[args.dtype]
    say(rank, f"scatter_gather: rank {ROOT} splits a {human(world * args.numel * dtype.itemsize)} batch among "
              f"{world} ranks, each adds rank+1 to its slice, rank {ROOT} gathers the results")
    mine = torch.empty(args.numel, dtype=dtype, device=device)
    for i in range(args.iters):
        full = batch(i, world, args.numel, dtype, device)
        mark(f"step {i}")
        dist.scatter(mine, scatter_list=list(full.unbind(0)) if rank == ROOT else None, src=ROOT)
        check(rank, f"step {i}: slice scattered from rank {ROOT}", mine, full[rank])
        mine += rank + 1
        out = [torch.empty_like(mine) for _ in range(world)] if rank == ROOT else None
        dist.gather(mine, gather_list=out, dst=ROOT)
        if rank == ROOT:
            for r in range(world):
                check(rank, f"step {i}: result gathered from rank {r}", out[r], full[r] + r + 1)
        pause(args)
    say(rank, f"scatter_gather: ok, rank {ROOT} got every rank's slice back, each with its rank+1 added")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

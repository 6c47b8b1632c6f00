"""A straggler: one rank sleeps before every collective, the others wait for it.

    commviz record -o slow.cvz -- torchrun --nproc-per-node 4 scenarios/straggler.py --delay 0.02

commviz names the rank that arrives last at most collectives, and by how much.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from _common import init, parser, say


def main() -> int:
    p = parser(__doc__, numel=1024, iters=20)
    p.add_argument("--delay", type=float, default=0.02, help="seconds the slow rank sleeps per step (default 0.02)")
    p.add_argument("--slow", type=int, default=-1, help="the slow rank (default: the last)")
    args = p.parse_args()
    rank, world, device = init()
    slow = args.slow if args.slow >= 0 else world - 1
    say(rank, f"straggler: rank {slow} is {args.delay * 1000:.0f} ms late to each of {args.iters} all_reduces")
    t = torch.ones(args.numel, device=device)
    for _ in range(args.iters):
        if rank == slow:
            time.sleep(args.delay)  # e.g. a slower data loader or a throttled GPU
        dist.all_reduce(t)
    say(rank, "straggler: finished")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A hang: one rank skips a collective in a sub-group, the others wait for it.

All ranks but the last form a sub-group (all of them on 2 ranks). Every member calls
all_reduce on it --iters times, except the victim (the last member), which skips
step --skip-at and moves on to a barrier on the default group, where the ranks
outside the sub-group already wait. The other members block in all_reduce
#skip-at forever (gloo's timeout is 30 minutes).

    commviz record -o hang.cvz --hang-timeout 5 -- torchrun --nproc-per-node 4 scenarios/hang.py

commviz names the waiting ranks, the missing rank, what it is doing instead, and the
line of code where each rank is stuck.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from _common import init, mark, parser, say


def main() -> int:
    p = parser(__doc__, numel=1024, iters=5)
    p.add_argument("--skip-at", type=int, default=2, help="the step the victim skips (default 2)")
    p.add_argument("--victim", type=int, default=-1, help="the rank that skips it (default: the last member)")
    args = p.parse_args()
    rank, world, device = init()
    members = list(range(max(2, world - 1)))
    victim = args.victim if args.victim >= 0 else members[-1]
    sub = dist.new_group(members)
    say(rank, f"hang: ranks {members} all_reduce in a sub-group; rank {victim} skips step {args.skip_at}")
    t = torch.ones(args.numel, device=device)
    if rank in members:
        for i in range(args.iters):
            mark(f"step {i}")
            if rank == victim and i == args.skip_at:
                break  # the bug: this rank leaves the loop early
            dist.all_reduce(t, group=sub)
            if args.interval:
                time.sleep(args.interval)
    dist.barrier()  # the victim (and non-members) wait here; the members never arrive
    say(rank, "hang: finished (the hang did not happen?)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

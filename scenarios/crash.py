"""A rank dies mid-run: the others wait in a collective for a rank that is gone.

    commviz record -o crash.cvz --hang-timeout 5 -- torchrun --nproc-per-node 3 scenarios/crash.py

commviz marks the rank dead (its process is gone without a goodbye) and names it as
the rank the others wait for.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from _common import init, parser, say


def main() -> int:
    p = parser(__doc__, numel=1024, iters=6)
    p.add_argument("--die-at", type=int, default=3, help="the step at which the victim dies (default 3)")
    p.add_argument("--victim", type=int, default=-1, help="the rank that dies (default: the last)")
    args = p.parse_args()
    rank, world, device = init()
    victim = args.victim if args.victim >= 0 else world - 1
    say(rank, f"crash: rank {victim} exits abruptly at step {args.die_at}")
    t = torch.ones(args.numel, device=device)
    for i in range(args.iters):
        if rank == victim and i == args.die_at:
            time.sleep(0.5)  # let its last events and the others' starts reach the watcher (a loaded box flushes late), as a real crash might not
            os._exit(17)  # no cleanup, no goodbye: like a segfault or an OOM kill
        dist.all_reduce(t)
        if args.interval:
            time.sleep(args.interval)
    say(rank, "crash: finished (no crash?)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

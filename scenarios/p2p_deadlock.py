"""A point-to-point deadlock: both ranks receive first, so neither ever sends.

    commviz record -o dl.cvz --hang-timeout 5 -- torchrun --nproc-per-node 2 scenarios/p2p_deadlock.py

commviz pairs the k-th send a→b with the k-th recv on b from a and shows the cycle:
rank 0 waits in recv←1 for rank 1, which waits in recv←0 for rank 0.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _common import init, parser, say


def main() -> int:
    p = parser(__doc__, numel=1024, iters=1)
    p.add_argument("--fixed", action="store_true", help="even ranks send first: no deadlock")
    args = p.parse_args()
    rank, world, device = init()
    peer = rank ^ 1
    if peer >= world:
        say(rank, "p2p_deadlock: needs an even number of ranks")
        return 2
    say(rank, "p2p_deadlock: every rank calls recv before send" + (" (fixed: even ranks send first)" if args.fixed else ""))
    buf = torch.zeros(args.numel, device=device)
    out = torch.full((args.numel,), float(rank), device=device)
    for _ in range(args.iters):
        if args.fixed and rank % 2 == 0:
            dist.send(out, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)  # the bug: both sides wait for the other to send
            dist.send(out, peer)
        if buf[0].item() != peer:
            print(f"rank {rank}: received {buf[0].item()}, expected {peer}", file=sys.stderr)
            return 1
    say(rank, "p2p_deadlock: finished")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

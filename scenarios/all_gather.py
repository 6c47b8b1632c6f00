"""all_gather: every rank contributes one chunk and every rank ends with all of
them, the second half of a ring all_reduce.

    torchrun --nproc-per-node 4 scenarios/all_gather.py --numel 4194304

`--numel` is the gathered total S (nccl-tests' size; rounded up to a multiple of the
rank count): each rank contributes S/n elements filled with rank+1 and receives the
other (n-1)·S/n. algbw = S / time, busbw = algbw × (n-1)/n, the figure that compares
with the link's speed whatever n is. The script prints both, timed by itself, and
commviz's Ops table should agree.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _common import DTYPES, check, human, init, mark, parser, say, say_bandwidth, timed_steps

# torch 2.13 deprecates all_gather_into_tensor in favour of all_gather_single; older torch has only the former
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


def main() -> int:
    p = parser(__doc__, numel=1 << 20, iters=20, numel_help="elements gathered in total (S/element size)")
    args = p.parse_args()
    rank, world, device = init()
    dtype = DTYPES[args.dtype]
    chunk = -(-args.numel // world)
    total = chunk * world
    nbytes = total * dtype.itemsize
    say(rank, f"all_gather: {world} ranks each contribute {human(chunk * dtype.itemsize)} and all end with "
              f"{human(nbytes)}" + ("" if total == args.numel else f" (numel rounded up to {total})"))
    mine = torch.full((chunk,), float(rank + 1), dtype=dtype, device=device)
    out = torch.empty(total, dtype=dtype, device=device)
    want = torch.arange(1, world + 1, dtype=dtype, device=device).repeat_interleave(chunk)
    mark("all_gather_single")
    spent = timed_steps(args, device, out, lambda: all_gather_single(out, mine),
                        lambda i: check(rank, f"step {i}: gathered tensor (chunk r is r+1)", out, want))
    say_bandwidth(rank, "all_gather", nbytes, args.iters, spent, (world - 1) / world, "(n-1)/n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

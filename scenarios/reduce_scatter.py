"""reduce_scatter: every rank contributes a whole tensor and ends with one chunk of
the element-wise sum, the first half of a ring all_reduce.

    torchrun --nproc-per-node 4 scenarios/reduce_scatter.py --numel 4194304

`--numel` is the input size S (nccl-tests' size; rounded up to a multiple of the rank
count). Rank r's input has chunk k filled with k + r + 1, so rank k's output chunk must
be n·(k+1) + n(n-1)/2 everywhere. algbw = S / time, busbw = algbw × (n-1)/n. A
reduce_scatter followed by an all_gather of the same S is an all_reduce: compare
the busbw of the three scenarios.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _common import DTYPES, check, human, init, mark, parser, say, say_bandwidth, timed_steps

# torch 2.13 deprecates reduce_scatter_tensor in favour of reduce_scatter_single; older torch has only the former
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def main() -> int:
    p = parser(__doc__, numel=1 << 20, iters=20, numel_help="input elements per rank (S/element size)")
    args = p.parse_args()
    rank, world, device = init()
    dtype = DTYPES[args.dtype]
    chunk = -(-args.numel // world)
    total = chunk * world
    nbytes = total * dtype.itemsize
    say(rank, f"reduce_scatter: {world} ranks each put in {human(nbytes)} and each end with its "
              f"{human(chunk * dtype.itemsize)} chunk of the sum" + ("" if total == args.numel else f" (numel rounded up to {total})"))
    inp = (torch.arange(world) + rank + 1).repeat_interleave(chunk).to(dtype=dtype, device=device)
    out = torch.empty(chunk, dtype=dtype, device=device)
    want = torch.full_like(out, world * (rank + 1) + world * (world - 1) / 2)
    mark("reduce_scatter_single")
    spent = timed_steps(args, device, out, lambda: reduce_scatter_single(out, inp),
                        lambda i: check(rank, f"step {i}: reduced chunk {rank}", out, want))
    say_bandwidth(rank, "reduce_scatter", nbytes, args.iters, spent, (world - 1) / world, "(n-1)/n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""all_to_all: MoE-style token dispatch, every rank sending a different number of
tokens to every other rank (uneven splits), and the results sent back.

    torchrun --nproc-per-node 4 scenarios/all_to_all.py --interval 0.2

Every rank holds `--tokens` tokens of `--numel` elements and hosts one expert. A toy
router sends token j of rank r at step s to expert (s + (j + r) mod (n+1)) mod n: one
expert is hot each step (it gets about twice the tokens of the others), and the hot
one moves round with the step. Each step is three all_to_all_single calls:

1. the counts: each rank tells each other rank how many tokens it will send (n int64);
2. the dispatch: tokens sorted by expert, sent with uneven input/output splits;
3. the combine: each expert multiplies its tokens by (its rank + 1) and sends them back.

The script checks that every token came home multiplied by its expert's factor.
Bytes are the total input: the dispatch is the same on every rank, the combine is
larger on the hot expert's rank.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _common import DTYPES, check, human, init, mark, parser, pause, say


def route(rank: int, step: int, world: int, tokens: int) -> torch.Tensor:
    """Expert of each of this rank's tokens (the toy router, see the docstring)."""
    j = torch.arange(tokens)
    return (step + (j + rank) % (world + 1)) % world


def main() -> int:
    p = parser(__doc__, numel=256, iters=10, numel_help="elements per token (the hidden size)")
    p.add_argument("--tokens", type=int, default=256, help="tokens per rank (default 256)")
    args = p.parse_args()
    rank, world, device = init()
    dtype = DTYPES[args.dtype]
    say(rank, f"all_to_all: {world} ranks dispatch {args.tokens} tokens of "
              f"{human(args.numel * dtype.itemsize)} each to {world} experts with uneven splits, and combine the results")
    g = torch.Generator().manual_seed(rank)
    hot = []
    for i in range(args.iters):
        x = torch.randn(args.tokens, args.numel, generator=g).to(dtype=dtype, device=device)
        expert = route(rank, i, world, args.tokens)
        order = torch.argsort(expert, stable=True)
        send_counts = torch.bincount(expert, minlength=world)

        mark(f"step {i}: counts")
        recv_counts = torch.empty_like(send_counts, device=device)
        dist.all_to_all_single(recv_counts, send_counts.to(device))
        in_splits, out_splits = send_counts.tolist(), recv_counts.tolist()

        mark(f"step {i}: dispatch")
        mine = torch.empty(sum(out_splits), args.numel, dtype=dtype, device=device)
        dist.all_to_all_single(mine, x[order.to(device)], out_splits, in_splits)
        mine *= rank + 1  # the expert's work

        mark(f"step {i}: combine")
        back = torch.empty_like(x)
        dist.all_to_all_single(back, mine, in_splits, out_splits)
        result = torch.empty_like(x)
        result[order.to(device)] = back
        check(rank, f"step {i}: tokens back from their experts", result, x * (expert.to(device) + 1).to(dtype)[:, None])
        hot.append(sum(out_splits))
        pause(args)
    say(rank, f"all_to_all: ok, every token came back from its expert "
              f"(rank 0's expert got {min(hot)}–{max(hot)} tokens a step, an even split would be {args.tokens})")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

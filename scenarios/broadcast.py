"""broadcast: rank 0's weights copied to every rank, as DDP does before training
starts so that every replica begins from the same model.

    torchrun --nproc-per-node 4 scenarios/broadcast.py --interval 0.2

Each step every rank initialises its own `--layers` weight tensors of `--numel`
elements from its own seed, so the replicas disagree; one broadcast per tensor from
rank 0 makes them identical to rank 0's. The script checks every element on every
rank. The payload flows out of one rank: the sender's link is the bottleneck, and
busbw equals algbw (factor 1).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _common import DTYPES, check, human, init, mark, parser, pause, say

SRC = 0


def weights(seed: int, layers: int, numel: int, dtype, device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=g).to(dtype=dtype, device=device) for _ in range(layers)]


def main() -> int:
    p = parser(__doc__, numel=1 << 16, iters=10, numel_help="elements per weight tensor")
    p.add_argument("--layers", type=int, default=4, help="weight tensors per model (default 4)")
    args = p.parse_args()
    rank, world, device = init()
    dtype = DTYPES[args.dtype]
    total = args.layers * args.numel * dtype.itemsize
    say(rank, f"broadcast: rank {SRC} sends its {args.layers} weight tensors ({human(total)}) to all {world} ranks, "
              f"{args.iters} times")
    for i in range(args.iters):
        mark(f"init {i}")
        mine = weights(1000 * i + rank, args.layers, args.numel, dtype, device)  # each rank's own random init
        for w in mine:
            dist.broadcast(w, src=SRC)
        want = weights(1000 * i + SRC, args.layers, args.numel, dtype, device)
        for k, (w, e) in enumerate(zip(mine, want)):
            check(rank, f"step {i}: weight {k} after broadcast from rank {SRC}", w, e)
        pause(args)
    say(rank, f"broadcast: ok, every rank holds rank {SRC}'s weights, bit for bit")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

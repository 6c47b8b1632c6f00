"""all_reduce built by hand from send/recv, the ring algorithm: a reduce-scatter
phase then an all-gather phase, checked against dist.all_reduce.

    torchrun --nproc-per-node 4 scenarios/ring_allreduce.py --interval 0.2

The tensor is cut into n chunks. In each of the n-1 reduce-scatter steps every rank
sends one chunk to rank+1 and adds the chunk it receives from rank-1 into its own
copy; afterwards rank r holds the full sum of chunk r+1. In each of the n-1
all-gather steps every rank passes on a finished chunk, until all ranks hold all of
them. Every rank sends 2(n-1) chunks of S/n, i.e. 2(n-1)/n × S bytes: that is where
all_reduce's busbw factor comes from. Each step's send and recv go through
batch_isend_irecv (events `isend`/`irecv`, marked batched), which posts both at once
and so cannot deadlock on any backend. The flow view shows the ring: every rank
talks only to its two neighbours.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from _common import DTYPES, check, human, init, mark, parser, pause, say, sync


def exchange(send: torch.Tensor, to: int, recv: torch.Tensor, frm: int) -> None:
    ops = [dist.P2POp(dist.isend, send, to), dist.P2POp(dist.irecv, recv, frm)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()


def ring_all_reduce(t: torch.Tensor, rank: int, world: int, scratch: torch.Tensor, label: bool) -> None:
    """Sum `t` across the ranks in place, with 2(n-1) neighbour exchanges."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    chunks = list(t.tensor_split(world))  # views into t
    if label:
        mark("ring: reduce-scatter")
    for s in range(world - 1):
        out, into = (rank - s) % world, (rank - s - 1) % world
        buf = scratch[: chunks[into].numel()]
        exchange(chunks[out], nxt, buf, prv)
        chunks[into] += buf
    # rank r now holds the full sum of chunk (r + 1) mod n
    if label:
        mark("ring: all-gather")
    for s in range(world - 1):
        out, into = (rank + 1 - s) % world, (rank - s) % world
        exchange(chunks[out], nxt, chunks[into], prv)


def main() -> int:
    p = parser(__doc__, numel=1 << 16, iters=10)
    args = p.parse_args()
    rank, world, device = init()
    if world < 2:
        say(rank, "ring_allreduce: needs at least 2 ranks")
        return 2
    dtype = DTYPES[args.dtype]
    nbytes = args.numel * dtype.itemsize
    say(rank, f"ring_allreduce: {world} ranks sum {human(nbytes)} by passing chunks round a ring "
              f"({2 * (world - 1)} sends of ~{human(nbytes / world)} each), checked against dist.all_reduce")
    scratch = torch.empty((args.numel + world - 1) // world, dtype=dtype, device=device)
    ring_s = ref_s = 0.0
    for i in range(args.iters):
        # small integers: every summation order gives the same bits, so the check is exact
        x = (torch.arange(args.numel) % 13 + rank + i % 7).to(dtype=dtype, device=device)
        ring, ref = x.clone(), x.clone()
        sync(device)
        t0 = time.perf_counter()
        ring_all_reduce(ring, rank, world, scratch, label=True)
        sync(device)
        t1 = time.perf_counter()
        mark("dist.all_reduce")
        dist.all_reduce(ref)
        sync(device)
        ring_s += t1 - t0
        ref_s += time.perf_counter() - t1
        check(rank, f"step {i}: hand-made ring all_reduce vs dist.all_reduce", ring, ref)
        pause(args)
    n = max(1, args.iters)
    say(rank, f"ring_allreduce: ok, the hand-made ring matches dist.all_reduce on every rank "
              f"(ring {ring_s / n * 1e3:.2f} ms, dist.all_reduce {ref_s / n * 1e3:.2f} ms per step)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

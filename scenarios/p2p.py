"""Point-to-point: a token passed around a ring with blocking send/recv, then every
rank shifting a tensor to its neighbour with isend/irecv while it computes.

    torchrun --nproc-per-node 4 scenarios/p2p.py --interval 0.2

Phase 1 ("blocking ring"): rank 0 sends a token to rank 1, each rank adds its own
rank+1 and passes it on, and the last rank sends it back to rank 0, which must find
1 + 2 + … + n. Only one transfer is in flight at a time: watch the token go round.

Phase 2 ("isend/irecv + compute"): every rank posts isend to rank+1 and irecv from
rank-1 (even ranks send first, odd ranks receive first, which keeps blocking
backends safe), runs a matmul while the bytes move, then waits. All the links are
busy at once, and the wait is short when the transfer hid behind the compute.

Each rank has `--iters` sends and `--iters` recvs (phase 1), and `--iters` isends and
`--iters` irecvs (phase 2), each of `--numel` elements.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from _common import DTYPES, check, human, init, mark, parser, pause, say, sync


def main() -> int:
    p = parser(__doc__, numel=1 << 16, iters=10)
    p.add_argument("--compute", type=int, default=256, help="side of the square matmul run during phase 2 (default 256)")
    args = p.parse_args()
    rank, world, device = init()
    if world < 2:
        say(rank, "p2p: needs at least 2 ranks")
        return 2
    dtype = DTYPES[args.dtype]
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    nbytes = args.numel * dtype.itemsize
    say(rank, f"p2p: a token of {human(nbytes)} goes round a ring of {world} ranks (send/recv), "
              f"then every rank shifts to its neighbour with isend/irecv behind a matmul")

    # phase 1: a blocking token pass, one link busy at a time
    mark("blocking ring")
    token = torch.empty(args.numel, dtype=dtype, device=device)
    for i in range(args.iters):
        if rank == 0:
            token.fill_(1)
            dist.send(token, dst=nxt)
            dist.recv(token, src=prv)
            check(rank, f"step {i}: token back at rank 0 (sum of rank+1 over the ring)", token,
                  torch.full_like(token, world * (world + 1) / 2))
        else:
            dist.recv(token, src=prv)
            check(rank, f"step {i}: token from rank {prv}", token, torch.full_like(token, rank * (rank + 1) / 2))
            token += rank + 1
            dist.send(token, dst=nxt)
        pause(args)

    # phase 2: everyone shifts at once; the transfer runs behind a matmul
    mark("isend/irecv + compute")
    out = torch.full((args.numel,), float(rank + 1), dtype=dtype, device=device)
    inbox = torch.empty_like(out)
    a = torch.randn(args.compute, args.compute, dtype=dtype, device=device)
    waited = 0.0
    for i in range(args.iters):
        inbox.fill_(-1)
        if rank % 2 == 0:
            reqs = [dist.isend(out, dst=nxt), dist.irecv(inbox, src=prv)]
        else:
            reqs = [dist.irecv(inbox, src=prv), dist.isend(out, dst=nxt)]
        b = a @ a  # work that does not need the incoming bytes
        sync(device)
        t0 = time.perf_counter()
        for r in reqs:
            r.wait()
        sync(device)
        waited += time.perf_counter() - t0
        check(rank, f"step {i}: tensor from rank {prv}", inbox, torch.full_like(inbox, prv + 1))
        del b
        pause(args)
    say(rank, f"p2p: ok, the token summed to {world * (world + 1) // 2} and every neighbour's tensor arrived "
              f"(waited {waited / max(1, args.iters) * 1e3:.2f} ms per step after the matmul)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

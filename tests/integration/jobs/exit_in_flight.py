"""A job that exits with async ops still in flight, never waiting for them: plain
torch exits cleanly (its gloo destructor drains the queue). Under commviz each such op
has a done-callback or a waiter thread that needs the GIL when it completes; one
that completes while the interpreter is finalizing used to abort the rank
("terminate called without an active exception")."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
big = torch.ones(1 << 16)
works = [dist.all_reduce(big, async_op=True) for _ in range(100)]
for _ in range(20):
    works.append(dist.isend(torch.ones(1 << 12), (rank + 1) % world))
    works.append(dist.irecv(torch.empty(1 << 12), (rank - 1) % world))

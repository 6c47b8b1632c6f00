"""Run with COMMVIZ_PURE=1 under commviz: a few collectives and p2p ops, then fails
if any compiled part of commviz was loaded in this rank."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(256)
for _ in range(20):
    dist.all_reduce(t)
dist.broadcast(t, src=0)
if rank % 2 == 0:
    dist.send(t, rank + 1)
else:
    dist.recv(t, rank - 1)
dist.barrier()
loaded = sorted(m for m in sys.modules if m.startswith("commviz") and "._fast" in m)
dist.destroy_process_group()
if loaded:
    sys.exit(f"rank {rank}: compiled parts loaded under COMMVIZ_PURE=1: {loaded}")

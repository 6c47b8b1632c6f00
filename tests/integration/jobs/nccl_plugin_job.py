"""A gloo job whose process also runs "NCCL": tests/fake_nccl.py plays NCCL on the
very library the probe pointed NCCL_PROFILER_PLUGIN at, loading it by that path as
NCCL would, so what the plugin sees must reach the trace through the probe's own
sender (run by tests/integration/test_nccl_plugin.py). Each rank: one communicator,
`--ops` all_reduces on 2 channels and a send to the next rank, and one captured
all_reduce replayed `--replays` times."""

import argparse
import ctypes
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.getcwd())  # the repository, for tests.fake_nccl
from tests.fake_nccl import FakeNccl  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--ops", type=int, default=50)
p.add_argument("--replays", type=int, default=20)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dist.all_reduce(torch.ones(4))  # the probe's own witness

nccl = FakeNccl(ctypes.CDLL(os.environ["NCCL_PROFILER_PLUGIN"]))
rc, ctx = nccl.init(0xC0FFEE00 + world, rank=rank, nranks=world)
assert rc == 0, "the plugin refused: the probe did not attach to it"
for i in range(args.ops):
    task = nccl.collective(ctx, seq=i, rank=rank, channels=2)
    nccl.kernel(ctx, task, 0, 1000 * i, 1000 * i + 100)
    nccl.kernel(ctx, task, 1, 1000 * i + 5, 1000 * i + 150)
send = nccl.p2p(ctx, b"Send", peer=(rank + 1) % world, count=64, dtype=b"ncclFloat32", rank=rank)
nccl.kernel(ctx, send, 0, 0, 10)
graph = nccl.collective(ctx, seq=args.ops, rank=rank, captured=True, channels=1)
for i in range(args.replays):
    nccl.kernel(ctx, graph, 0, i * 100, i * 100 + 20)
nccl.finalize(ctx)
dist.barrier()
dist.destroy_process_group()

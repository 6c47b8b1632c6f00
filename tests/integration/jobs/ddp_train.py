"""DDP for two iterations on 2 gloo ranks with a small bucket cap (two buckets).
Unmodified: it never imports commviz. Writes what DDP itself reports to --report."""

import argparse
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("--report", required=True)
ap.add_argument("--hook", choices=["none", "before", "after"], default="none")
args = ap.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
# 2 x (512*512 + 512) floats, each just over 1 MiB: with an explicit 1 MiB cap each
# layer gets its own bucket once DDP rebuilds its buckets after the first step (that
# first step reduces everything in one bucket)
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))
ddp = DDP(model, bucket_cap_mb=1)
calls = []


def my_hook(state, bucket):
    calls.append(bucket.index())
    t = bucket.buffer()
    t.div_(dist.get_world_size())
    return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])


if args.hook == "before":
    ddp.register_comm_hook(None, my_hook)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step in range(2):
    out = ddp(torch.randn(8, 512))
    if step == 0 and args.hook == "after":
        ddp.register_comm_hook(None, my_hook)  # legal until the first backward
    out.sum().backward()
    opt.step()
    opt.zero_grad()
# the model replicas must agree after sync
w = model[0].weight.detach().clone()
dist.all_reduce(w)
assert torch.allclose(w / 2, model[0].weight), "replicas diverged"
data = ddp._get_ddp_logging_data()
if rank == 0:
    with open(args.report, "w") as f:
        rebuilt = [b.buffer().nbytes for b in ddp.reducer._get_zeros_like_grad_buckets()]
        json.dump({"logging": {k: v for k, v in data.items() if "bucket" in k or "comm_hook" in k},
                   "rebuilt_bucket_bytes": rebuilt, "hook_calls": calls,
                   "params": [p.numel() * p.element_size() for p in model.parameters()]}, f)
dist.destroy_process_group()

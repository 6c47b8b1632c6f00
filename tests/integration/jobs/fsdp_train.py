"""One FSDP2 (fully_shard) training step on 2 gloo CPU ranks. Unmodified: it never
imports commviz. Writes the parameter sizes to --report."""

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

ap = argparse.ArgumentParser()
ap.add_argument("--report", required=True)
args = ap.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 16))
for layer in model:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(4, 64)).sum().backward()
opt.step()
if dist.get_rank() == 0:
    sizes = [[p.numel() * p.element_size() for p in layer.parameters()] for layer in model]
    with open(args.report, "w") as f:
        json.dump({"layer_param_bytes": sizes, "world": dist.get_world_size()}, f)
dist.destroy_process_group()

"""One FSDP training step on 2 gloo CPU ranks: FSDP2 (fully_shard) by default, FSDP1
(FullyShardedDataParallel, each layer its own unit) with --fsdp1. Unmodified: it
never imports commviz. Writes the parameter sizes to --report."""

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

ap = argparse.ArgumentParser()
ap.add_argument("--report", required=True)
ap.add_argument("--fsdp1", action="store_true")
args = ap.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 16))
# unsharded bytes per layer, before any wrapping flattens or shards them
sizes = [[p.numel() * p.element_size() for p in layer.parameters()] for layer in model]
if args.fsdp1:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}), device_id=torch.device("cpu"))
else:
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(4, 64)).sum().backward()
opt.step()
if dist.get_rank() == 0:
    with open(args.report, "w") as f:
        json.dump({"layer_param_bytes": sizes, "world": dist.get_world_size()}, f)
dist.destroy_process_group()

"""FSDP2 (fully_shard): the same model as ddp_train.py, but each rank stores only
1/n of every weight, gathers a layer's weights just before using it and
reduce-scatters its gradients right after.

    torchrun --nproc-per-node 4 scenarios/fsdp_train.py --interval 0.2

Each layer is its own FSDP unit. Per step commviz shows, per layer:

- forward: one `all_gather_single` (the layer's full weights, numel² elements), freed
  again after the layer ran;
- backward: the same all_gather again (weights are needed for the gradient), then one
  `reduce_scatter_single` of the layer's gradient: each rank keeps the averaged
  gradient of its own shard.

So 2 × layers all_gathers and `--layers` reduce_scatters per step, in reverse layer
order in backward. Keep `--numel` a multiple of the rank count so no padding is added.
Every rank also trains a local copy on the whole batch; its shard must match it after
every step, or the script fails.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from _common import DTYPES, check, human, init, mark, mlp, parser, pause, say


def main() -> int:
    p = parser(__doc__, numel=512, iters=5, numel_help="layer width (each layer has numel² weights)")
    p.add_argument("--layers", type=int, default=4, help="Linear layers (default 4)")
    p.add_argument("--batch", type=int, default=8, help="samples per rank per step (default 8)")
    args = p.parse_args()
    rank, world, device = init()
    dtype = DTYPES[args.dtype]
    model = mlp(args.numel, args.layers, dtype, device)
    ref = copy.deepcopy(model)  # trained locally on the whole batch, for the check
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    for layer in linears:
        fully_shard(layer)  # one unit per layer: its own all_gather / reduce_scatter
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    layer_bytes = args.numel * args.numel * dtype.itemsize
    say(rank, f"fsdp_train: {world} ranks train {args.layers} layers of {human(layer_bytes)} with FSDP2, each rank "
              f"storing 1/{world}: all_gather in forward and backward, reduce_scatter in backward")
    tol = dict(rtol=1e-4, atol=1e-5) if dtype in (torch.float32, torch.float64) else dict(rtol=5e-2, atol=1e-2)
    g = torch.Generator().manual_seed(1234)  # the same batches on every rank
    ref_linears = [m for m in ref if isinstance(m, torch.nn.Linear)]
    for i in range(args.iters):
        full = torch.randn(world * args.batch, args.numel, generator=g).to(dtype=dtype, device=device)
        mark(f"step {i}: forward")
        loss = model(full[rank * args.batch:(rank + 1) * args.batch]).pow(2).mean()
        mark(f"step {i}: backward")
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref(full).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
        for k, (a, b) in enumerate(zip(linears, ref_linears)):
            shard = a.weight.to_local()  # this rank's rows of the weight (a DTensor shard)
            want = b.weight.detach().tensor_split(world, dim=0)[rank]
            check(rank, f"step {i}: shard of layer {k} vs the model trained on the whole batch",
                  shard[: want.shape[0]], want, **tol)
        pause(args)
    say(rank, f"fsdp_train: ok, every rank's shards match the whole-batch model after {args.iters} steps")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""DDP: a small model trained data-parallel, its gradients all-reduced in buckets.

    torchrun --nproc-per-node 4 scenarios/ddp_train.py --interval 0.2
    torchrun --nproc-per-node 4 scenarios/ddp_train.py --bucket-cap-mb 1 --interval 0.2

The model is `--layers` square Linear layers (no bias) of width `--numel`, so every
gradient is numel² elements. Each rank trains on its own slice of the batch; DDP
averages the gradients by all-reducing them in buckets as backward produces them,
and commviz shows one `ddp_bucket` event per bucket. What to watch:

- step 1 is a single bucket with every gradient: DDP does not bucket before it has
  seen the order backward produces gradients in (when find_unused_parameters and
  static_graph are off);
- from step 2 the buckets are rebuilt in that order, each closed once it reaches
  `--bucket-cap-mb` (MiB): a small cap gives many small all-reduces that can start
  early, overlapping backward; a large cap few big ones. Without the flag torch uses
  25 MiB and caps the first rebuilt bucket (the last layers' gradients) at 1 MiB;
  with it, every bucket, the first included, gets the cap you gave.

With the defaults (4 layers of 512² floats, 1 MiB each) that is 1 then 2 buckets a
step (1 MiB + 3 MiB); with `--bucket-cap-mb 1`, 1 then 4.

Every rank also trains a local copy on the whole batch; the DDP replica must match it
after every step, or the script fails.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from _common import DTYPES, check, human, init, mark, mlp, parser, pause, say


def main() -> int:
    p = parser(__doc__, numel=512, iters=5, numel_help="layer width (each layer has numel² weights)")
    p.add_argument("--layers", type=int, default=4, help="Linear layers (default 4)")
    p.add_argument("--batch", type=int, default=8, help="samples per rank per step (default 8)")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP bucket size in MiB (default: torch's, 25 with a 1 MiB first bucket)")
    args = p.parse_args()
    rank, world, device = init()
    dtype = DTYPES[args.dtype]
    model = mlp(args.numel, args.layers, dtype, device)
    ref = copy.deepcopy(model)  # trained locally on the whole batch, for the check
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    cap = "torch's default cap" if args.bucket_cap_mb is None else f"a {args.bucket_cap_mb:g} MiB cap"
    say(rank, f"ddp_train: {world} ranks train {args.layers} layers ({human(grad_bytes)} of gradients) with DDP, "
              f"{cap}: watch the ddp_bucket events")
    tol = dict(rtol=1e-4, atol=1e-5) if dtype in (torch.float32, torch.float64) else dict(rtol=5e-2, atol=1e-2)
    g = torch.Generator().manual_seed(1234)  # the same batches on every rank
    for i in range(args.iters):
        mark(f"step {i}")
        full = torch.randn(world * args.batch, args.numel, generator=g).to(dtype=dtype, device=device)
        ddp(full[rank * args.batch:(rank + 1) * args.batch]).pow(2).mean().backward()  # buckets all-reduce here
        opt.step()
        opt.zero_grad()
        ref(full).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
        for k, (a, b) in enumerate(zip(model.parameters(), ref.parameters())):
            check(rank, f"step {i}: weight {k} of the DDP replica vs the model trained on the whole batch", a, b, **tol)
        pause(args)
    try:  # private API, only for the lesson's printout
        rebuilt = [b.buffer().nbytes for b in ddp.reducer._get_zeros_like_grad_buckets()]
        layout = f"{len(rebuilt)} bucket{'s' if len(rebuilt) != 1 else ''} ({', '.join(human(b) for b in rebuilt)}) a step after the rebuild"
    except Exception:
        layout = "buckets rebuilt after step 1"
    say(rank, f"ddp_train: ok, replicas match the whole-batch model; step 1 was one bucket of {human(grad_bytes)}, "
              f"then {layout}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

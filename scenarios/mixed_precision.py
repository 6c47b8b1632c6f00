"""Mixed precision: the same gradient sync in fp32, then in bf16, which moves
exactly half the bytes.

    torchrun --nproc-per-node 4 scenarios/mixed_precision.py --interval 0.2

Each rank has `--layers` gradients of `--numel` elements. Phase 1 ("fp32 gradient
sync") all-reduces them in `--dtype` (float32) and divides by n; phase 2 ("bf16
gradient sync") casts the same gradients to `--low` (bfloat16) first, all-reduces
those, and casts back, as DDP's bf16_compress_hook or FSDP's reduce_dtype do. Same
ops, same element counts, half the bytes: commviz's bytes column halves, and on a
link-bound job so does the time. The price is precision: the script prints the
largest error of the bf16 result against the fp32 one and fails if it exceeds what
bf16's 8-bit mantissa allows. The fp32 result is checked against the exact average
(each rank regenerates everyone's gradients).
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from _common import DTYPES, check, fail, human, init, mark, parser, pause, say, sync


def grads(rank: int, step: int, layers: int, numel: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * step + rank)
    return [torch.randn(numel, generator=g, dtype=torch.float64) for _ in range(layers)]


def main() -> int:
    p = parser(__doc__, numel=1 << 16, iters=5, numel_help="elements per gradient")
    p.add_argument("--layers", type=int, default=4, help="gradients per step (default 4)")
    p.add_argument("--low", choices=["bfloat16", "float16"], default="bfloat16", help="the low precision (default bfloat16)")
    args = p.parse_args()
    rank, world, device = init()
    high, low = DTYPES[args.dtype], DTYPES[args.low]
    per_step = args.layers * args.numel
    say(rank, f"mixed_precision: {world} ranks average {args.layers} gradients of {args.numel} elements in {args.dtype} "
              f"({human(per_step * high.itemsize)} a step), then in {args.low} ({human(per_step * low.itemsize)} a step)")
    worst, times = 0.0, {}
    for phase, dtype in (("high", high), ("low", low)):
        name = args.dtype if phase == "high" else args.low
        mark(f"{name} gradient sync")
        spent = 0.0
        for i in range(args.iters):
            everyone = [grads(r, i, args.layers, args.numel) for r in range(world)]  # float64, exact
            for k in range(args.layers):
                exact = sum(e[k] for e in everyone) / world
                t = everyone[rank][k].to(dtype=high, device=device).to(dtype)  # the gradient, then (maybe) cast down
                sync(device)
                t0 = time.perf_counter()
                dist.all_reduce(t)
                sync(device)
                spent += time.perf_counter() - t0
                avg = t.to(torch.float64).cpu() / world
                if phase == "high":
                    check(rank, f"step {i}: {name} average of gradient {k}", avg, exact, rtol=1e-5, atol=1e-6)
                    continue
                # the casts and each partial sum round by at most eps relative: a bound per element
                bound = 2 * world * torch.finfo(dtype).eps * sum(e[k].abs() for e in everyone) / world
                err = (avg - exact).abs()
                worst = max(worst, err.max().item())
                if bool((err > bound).any()):
                    j = int((err > bound).nonzero()[0])
                    fail(rank, f"step {i}: {name} average of gradient {k}, element {j}",
                         f"{exact[j].item():.6g} within {bound[j].item():.3g}", f"{avg[j].item():.6g}")
            pause(args)
        times[phase] = spent
    n = max(1, args.iters)
    say(rank, f"mixed_precision: ok, {args.dtype} {times['high'] / n * 1e3:.2f} ms a step, {args.low} "
              f"{times['low'] / n * 1e3:.2f} ms a step for half the bytes; largest {args.low} error {worst:.2g}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

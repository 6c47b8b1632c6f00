"""Overlap: gradient all-reduces issued with async_op=True while the next layer's
backward computes, against the same all-reduces run one after the other.

    torchrun --nproc-per-node 4 scenarios/overlap.py --interval 0.2

Each step stands in for a backward pass over `--layers` layers: a matmul of side
`--compute` per layer produces a "gradient" of `--numel` elements, which must be
summed across ranks. Phase 1 ("serialized") calls a blocking all_reduce after each
layer: compute and communication take turns. Phase 2 ("overlapped") launches each
all_reduce with async_op=True and goes straight on to the next layer's matmul,
waiting for all of them only at the end, which is what DDP's buckets and FSDP's
prefetching do. The script prints both step times. In the dashboard the async
all_reduces (marked async) start while the rank is still computing; on a GPU they
run on NCCL's stream beside the compute, on a CPU gloo uses its own threads, which
compete with the matmul for cores.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from _common import DTYPES, check, init, mark, parser, pause, say, sync


def layer_grad(a: torch.Tensor, k: int, rank: int, numel: int) -> torch.Tensor:
    """A layer's backward: a matmul (the cost), and a gradient to sum (known values)."""
    (a @ a).tanh_()
    return torch.full((numel,), float(rank + k + 1), dtype=a.dtype, device=a.device)


def main() -> int:
    p = parser(__doc__, numel=1 << 18, iters=5, numel_help="elements per layer's gradient")
    p.add_argument("--layers", type=int, default=8, help="layers per step (default 8)")
    p.add_argument("--compute", type=int, default=384, help="side of each layer's square matmul (default 384)")
    args = p.parse_args()
    rank, world, device = init()
    dtype = DTYPES[args.dtype]
    a = torch.randn(args.compute, args.compute, dtype=dtype, device=device)
    want = [torch.full((args.numel,), float(world * (k + 1) + world * (world - 1) // 2), dtype=dtype, device=device)
            for k in range(args.layers)]
    say(rank, f"overlap: {args.layers} layers × (matmul {args.compute}² + all_reduce of {args.numel} elements) "
              f"a step, serialized then overlapped")
    times = {}
    for phase in ("serialized", "overlapped"):
        mark(phase)
        spent = 0.0
        for i in range(args.iters):
            sync(device)
            t0 = time.perf_counter()
            grads, works = [], []
            for k in range(args.layers):
                g = layer_grad(a, k, rank, args.numel)
                grads.append(g)
                if phase == "serialized":
                    dist.all_reduce(g)  # the rank idles until the sum is done
                else:
                    works.append(dist.all_reduce(g, async_op=True))  # returns at once
            for w in works:
                w.wait()
            sync(device)
            spent += time.perf_counter() - t0
            for k, g in enumerate(grads):
                check(rank, f"{phase} step {i}: sum of layer {k}'s gradient", g, want[k])
            pause(args)
        times[phase] = spent / max(1, args.iters)
    s, o = times["serialized"], times["overlapped"]
    say(rank, f"overlap: ok, serialized {s * 1e3:.1f} ms a step, overlapped {o * 1e3:.1f} ms a step "
              f"({(1 - o / s) * 100 if s else 0:.0f}% saved)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

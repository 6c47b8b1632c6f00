"""Shared set-up for the scenarios: backend by device, flags every lesson takes,
and commviz instrumentation when it is installed (plain torchrun streams to a
running `commviz watch`)."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

try:
    import commviz

    commviz.instrument()
except ImportError:  # the lessons run without commviz too
    commviz = None

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def parser(doc: str, numel: int = 1 << 16, iters: int = 10) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.strip().split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(doc.strip().split("\n\n")[1:]))
    p.add_argument("--numel", type=int, default=numel, help=f"elements per tensor (default {numel})")
    p.add_argument("--iters", type=int, default=iters, help=f"steps (default {iters})")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--interval", type=float, default=0.0, help="seconds to pause between steps, to watch")
    return p


def init() -> tuple[int, int, torch.device]:
    """Process group on NCCL when CUDA is there, gloo otherwise; (rank, world, device)."""
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def say(rank: int, text: str) -> None:
    if rank == 0:
        print(text, flush=True)


def mark(text: str) -> None:
    if commviz is not None:
        commviz.mark(text)

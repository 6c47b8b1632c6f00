"""Shared set-up for the scenarios: backend by device, flags every lesson takes,
and commviz instrumentation when it is installed (plain torchrun streams to a
running `commviz watch`)."""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

try:
    import commviz

    commviz.instrument()
except ImportError:  # the lessons run without commviz too
    commviz = None

if commviz is not None:
    from commviz.units import format_bytes as human  # 1536 -> '1.5 KiB', as the dashboard says it
else:

    def human(nbytes: float) -> str:
        return f"{int(nbytes):,} B"

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def parser(doc: str, numel: int = 1 << 16, iters: int = 10, numel_help: str = "elements per tensor") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.strip().split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(doc.strip().split("\n\n")[1:]))
    p.add_argument("--numel", type=int, default=numel, help=f"{numel_help} (default {numel})")
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


def pause(args) -> None:
    """Sleep --interval seconds between steps, so a person can follow along."""
    if args.interval:
        time.sleep(args.interval)


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, for the lesson's own timings (never needed on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fail(rank: int, what: str, expected, got):
    """Stop this rank loudly: non-zero exit, a message naming the rank and the values."""
    sys.stderr.write(f"rank {rank}: {what}: expected {expected}, got {got}\n")  # one write: ranks don't interleave
    sys.stderr.flush()
    raise SystemExit(1)


def check(rank: int, what: str, got: torch.Tensor, expected: torch.Tensor, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Exact (default) or approximate comparison; on a mismatch, fail() with the first bad element."""
    got, expected = got.detach(), expected.detach().to(got.device)
    if got.shape != expected.shape:
        fail(rank, f"{what}: shape", tuple(expected.shape), tuple(got.shape))
    g, e = got.double(), expected.double()
    bad = ~torch.isclose(g, e, rtol=rtol, atol=atol) if (rtol or atol) else g != e
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        fail(rank, f"{what} (element {i} of {g.numel()}, {int(bad.sum())} wrong)", e.flatten()[i].item(), g.flatten()[i].item())


def mlp(width: int, layers: int, dtype, device) -> torch.nn.Module:
    """The model of the training lessons (ddp_train, fsdp_train): the same weights
    everywhere, so the two lessons move comparable bytes."""
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width, bias=False), torch.nn.Tanh()]
    return torch.nn.Sequential(*blocks).to(dtype=dtype, device=device)


def say_bandwidth(rank: int, name: str, nbytes: int, iters: int, spent: float, factor: float, rule: str) -> None:
    """nccl-tests' figures for a timed loop: algbw = S/t, busbw = algbw x factor."""
    algbw = nbytes * iters / spent / 1e9 if spent else 0.0
    say(rank, f"{name}: ok, {spent / max(1, iters) * 1e6:.0f} µs per call, algbw {algbw:.3g} GB/s, "
              f"busbw {algbw * factor:.3g} GB/s (factor {rule} = {factor:.2f})")


def timed_steps(args, device, out: torch.Tensor, call, verify) -> float:
    """Run `call()` --iters times into a zeroed `out`, timing only the call (the
    device synchronized around it), then `verify(i)` and the --interval pause.
    Returns the seconds spent in the calls."""
    spent = 0.0
    for i in range(args.iters):
        out.fill_(0)
        sync(device)
        t0 = time.perf_counter()
        call()
        sync(device)
        spent += time.perf_counter() - t0
        verify(i)
        pause(args)
    return spent

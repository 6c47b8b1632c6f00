"""Host time the probe adds to launching an NCCL all_reduce (issue 15 item 4): what the
training thread pays per op on a GPU, the CUDA branch included (capture check, timing
events on the tensor's stream). Run on one GPU, under torchrun, by bench/gpu_check.sh:

    torchrun --standalone --nproc-per-node 1 bench/nccl_launch.py [--rounds 30] [--calls 200]

Bare and instrumented launches are interleaved in rounds (noise hits both alike); the
device is synchronized between blocks, never inside a timed one. The probe's own
CUDA thread keeps polling during the instrumented blocks, as in a real job. The last
line is the figure: the median over rounds of the added µs per launch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def launches(all_reduce, x, calls: int, sync) -> float:
    """Host ns per launch of `calls` back-to-back all_reduces of `x`; the device is
    synchronized before and after, never inside."""
    sync()
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        all_reduce(x)
    dt = (time.perf_counter_ns() - t0) / calls
    sync()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--numel", type=int, default=1 << 20)
    ap.add_argument("--dry-run", action="store_true", help="gloo on the CPU: rehearse the script without a GPU")
    args = ap.parse_args()
    os.environ.setdefault("COMMVIZ_ADDR", f"ipc://{tempfile.mkdtemp()}/nobody.sock")  # no watcher: sends dropped
    import torch
    import torch.distributed as dist

    import commviz
    from commviz.probe.patch import suspended

    from commviz.probe.patch import current

    probe = commviz.instrument()
    assert probe is not None, "commviz is off (COMMVIZ=0?): nothing would be measured"
    dist.init_process_group("gloo" if args.dry_run else "nccl")
    x = torch.ones(args.numel, device="cpu" if args.dry_run else "cuda:0")
    sync = (lambda: None) if args.dry_run else torch.cuda.synchronize

    def block() -> float:
        return launches(dist.all_reduce, x, args.calls, sync)

    for _ in range(3):  # warm-up: NCCL communicator, probe start, caches
        block()
        with suspended():
            block()
    bare, added = [], []
    first = next(current().ids)  # op ids: the probe really recorded the instrumented launches
    for _ in range(args.rounds):
        with suspended():
            b = block()
        p = block()
        bare.append(b)
        added.append(p - b)
    recorded = next(current().ids) - first - 1
    assert recorded == args.rounds * args.calls, f"the probe recorded {recorded} of {args.rounds * args.calls} launches"
    q = statistics.quantiles(added, n=4)
    print(f"bare NCCL all_reduce launch: {statistics.median(bare) / 1e3:.2f} us "
          f"({args.numel * 4 / 1e6:.1f} MB, {args.calls} launches x {args.rounds} rounds)")
    print(f"middle half of rounds: {q[0] / 1e3:+.2f} .. {q[2] / 1e3:+.2f} us")
    print(f"probe added host time per NCCL all_reduce launch: {statistics.median(added) / 1e3:.2f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

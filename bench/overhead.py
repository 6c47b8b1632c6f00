"""Probe overhead per op on torch's `fake` backend (no communication, so the
difference is the probe's alone). Bare and instrumented calls are interleaved in
rounds so machine noise hits both alike; prints the median added nanoseconds.

    python bench/overhead.py [--rounds 30] [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def timed(f, fargs, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        f(*fargs)
    return (time.perf_counter_ns() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()

    os.environ["COMMVIZ_ADDR"] = f"ipc://{tempfile.mkdtemp()}/nobody.sock"  # events go to the backlog
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import commviz

    commviz.instrument()
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    small = torch.ones(256)
    out = torch.empty(1024)
    cases = {
        "all_reduce (1 KiB)": (dist.all_reduce, (small,)),
        "send (1 KiB)": (dist.send, (small, 1)),
        "all_gather_into_tensor": (dist.all_gather_into_tensor, (out, small)),
    }
    import warnings

    warnings.simplefilter("ignore")
    from commviz.probe.patch import current, suspended

    probe = current()
    print(f"{'op':<26}{'bare ns':>10}{'instr ns':>10}{'added ns':>10}{'ratio':>8}")
    for name, (fn, fargs) in cases.items():
        bare_fn = fn._commviz_original
        bare, inst = [], []
        for _ in range(args.rounds):
            # torch's send calls isend through the module namespace: suspend every
            # wrapper, not just the outer one, for a truly bare run.
            with suspended():
                bare.append(timed(bare_fn, fargs, args.calls))
            inst.append(timed(fn, fargs, args.calls))
        b, i = statistics.median(bare), statistics.median(inst)
        print(f"{name:<26}{b:>10.0f}{i:>10.0f}{i - b:>10.0f}{i / b:>8.2f}")
    caller_only(probe, small, args.rounds)
    probe.shutdown()


def caller_only(probe, t, rounds: int) -> None:
    """Split the figure: the wrapper around a no-op function, with the probe's thread
    stopped (queue cleared between rounds, GC off), is what the caller's thread pays;
    the rest of the added time above is the probe thread's encoding under the GIL."""
    import gc

    import torch.distributed.distributed_c10d as c10d

    from commviz import ops
    from commviz.probe.patch import _wrap

    def noop(tensor, op=c10d.ReduceOp.SUM, group=None, async_op=False):
        return None

    wrapped = _wrap(noop, ops.CATALOGUE["all_reduce"], probe)
    probe.sender._stop.set()
    probe.sender.thread.join()
    gc.disable()
    added = []
    try:
        for _ in range(rounds):
            b = timed(noop, (t,), 20000)
            a = timed(wrapped, (t,), 20000)
            probe.queue.clear()
            added.append(a - b)
    finally:
        gc.enable()
    print(f"{'caller thread only':<26}{'':>10}{'':>10}{statistics.median(added):>10.0f}   (all_reduce wrapper on a no-op)")


if __name__ == "__main__":
    main()

"""Probe overhead per op on torch's `fake` backend (no communication, so the
difference is the probe's alone), the probe thread's work included.

Bare and instrumented calls are interleaved in rounds so machine noise hits both
alike; each row is the median over rounds of (instrumented - bare) in the same
round, with the middle half of the rounds as the spread. Every timed block ends
with the probe thread flushing what the block queued (drain, encode, write), so its
work is charged to the block that caused it rather than to whichever block its
20 ms timer happened to land in; bare blocks end with the same (empty) flush, so
the thread hand-over cancels out.

Two floors are measured in the same run, around the bare all_reduce: a pass-through
wrapper (`*args, **kwargs` in and out) and a minimal recording wrapper (two clock
reads and one tuple append). Compare the rows with them, not across runs: on a
shared box absolute figures move by 2x between runs, ratios within one run do not.

    python bench/overhead.py [--rounds 40] [--calls 2000]

The last line is the figure: the largest added ns per op over the three ops,
crash ring off. Two more rows show what torch.compile support costs: the C wrapper
called without the shim dynamo needs in front of it, and the functional all_reduce
a compiled graph runs, seen by the dispatcher kernel.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import statistics
import tempfile
import threading
import time


def stopped_fake_probe(stop_sampler: bool = False):
    """A probe on torch's `fake` backend (world of 4, rank 0, no watcher, crash ring
    off) whose sender thread is stopped, so the caller flushes it by hand on its own
    thread; the sampler too if asked (it queues samples of its own). Returns
    (probe, sender, suspended)."""
    os.environ["COMMVIZ_ADDR"] = f"ipc://{tempfile.mkdtemp()}/nobody.sock"
    os.environ["COMMVIZ_RING"] = "0"
    import warnings

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import commviz
    from commviz.probe.patch import current, suspended

    warnings.simplefilter("ignore")
    commviz.instrument()
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    probe = current()
    probe.ensure_started()
    sender = probe.sender
    sender._stop.set()
    sender._wake.set()
    sender.thread.join()
    if stop_sampler and probe.sampler is not None:
        probe.sampler.stop()
    return probe, sender, suspended


def timed(f, fargs, calls: int, flush) -> tuple[float, float]:
    """(wall, cpu) ns per call; cpu is the process's, every thread's, so the probe
    thread's flush is in it, and time the box gave to others is not."""
    c0, t0 = time.process_time_ns(), time.perf_counter_ns()
    for _ in range(calls):
        f(*fargs)
    flush()
    return (time.perf_counter_ns() - t0) / calls, (time.process_time_ns() - c0) / calls


class Flusher:
    """Stands in for the sender thread's timer: flushes when asked, on its own
    thread (so the GIL hand-over a real flush costs is in the figure)."""

    def __init__(self, sender) -> None:
        self.sender = sender
        self.ask, self.done = threading.Event(), threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.ask.wait()
            self.ask.clear()
            self.sender.flush()
            self.done.set()

    def __call__(self) -> None:
        self.done.clear()
        self.ask.set()
        self.done.wait()


def floors(orig):
    """A pass-through wrapper and a minimal recording one around `orig`."""
    clock = time.monotonic_ns
    q = collections.deque()
    app = q.append

    def passthrough(*args, **kwargs):
        return orig(*args, **kwargs)

    def minimal(*args, **kwargs):
        t0 = clock()
        r = orig(*args, **kwargs)
        app((t0, clock()))
        return r

    return passthrough, minimal, q.clear


def spread(diffs: list[float]) -> str:
    q1, _, q3 = statistics.quantiles(diffs, n=4)
    return f"{q1:.0f}..{q3:.0f}"


def med(xs) -> float:
    return statistics.median(xs)


def measure(rows, rounds: int, calls: int, flush, suspended) -> dict:
    """rows: name -> (instrumented fn, bare fn, args, after-block cleanup or None).
    Returns name -> (bare wall, wall diffs, cpu diffs)."""
    got = {name: ([], [], []) for name in rows}
    for _ in range(rounds):
        for name, (fn, bare_fn, fargs, cleanup) in rows.items():
            # torch's send calls isend through the module namespace: suspend every
            # wrapper, not just the outer one, for a truly bare run.
            with suspended():
                b = timed(bare_fn, fargs, calls, flush)
                if cleanup is not None:  # a floor wrapper runs with the probe suspended too
                    i = timed(fn, fargs, calls, flush)
                    cleanup()
            if cleanup is None:
                i = timed(fn, fargs, calls, flush)
            bare, wall, cpu = got[name]
            bare.append(b[0])
            wall.append(i[0] - b[0])
            cpu.append(i[1] - b[1])
    return {name: (med(bare), wall, cpu) for name, (bare, wall, cpu) in got.items()}


def report(results: dict) -> None:
    for name, (bare, wall, cpu) in results.items():
        print(f"{name:<40}{bare:>7.0f}{med(wall):>7.0f} {spread(wall):>12}{med(cpu):>7.0f} {spread(cpu):>12}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()

    os.environ["COMMVIZ_ADDR"] = f"ipc://{tempfile.mkdtemp()}/nobody.sock"  # events go to the backlog
    os.environ["COMMVIZ_RING_DIR"] = tempfile.mkdtemp()
    import warnings

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import commviz
    from commviz.probe.patch import current, suspended

    warnings.simplefilter("ignore")
    commviz.instrument()
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    probe = current()
    small, out = torch.ones(256), torch.empty(1024)
    cases = {
        "all_reduce (1 KiB)": (dist.all_reduce, (small,)),
        "send (1 KiB)": (dist.send, (small, 1)),
        "all_gather_into_tensor": (dist.all_gather_into_tensor, (out, small)),
    }
    passthrough, minimal, clear = floors(dist.all_reduce._commviz_original)
    rows = {
        "floor: pass-through wrapper": (passthrough, dist.all_reduce._commviz_original, (small,), lambda: None),
        "floor: 2 clock reads + 1 append": (minimal, dist.all_reduce._commviz_original, (small,), clear),
    }
    rows.update({name: (fn, fn._commviz_original, fargs, None) for name, (fn, fargs) in cases.items()})
    # The C wrapper without the Python shim that lets dynamo see through it
    # (probe/transparent.py): the difference from the all_reduce row is the shim's.
    fast = getattr(dist.all_reduce, "_commviz_fast", None)
    if fast is not None:
        rows["all_reduce, C wrapper without shim"] = (fast, dist.all_reduce._commviz_original, (small,), None)
    # What a compiled graph runs: the `_c10d_functional` op and its wait, seen by
    # the dispatcher kernel (probe/kernels.py); bare is the same call, kernels out.
    ar, wait, name = (torch.ops._c10d_functional.all_reduce.default, torch.ops._c10d_functional.wait_tensor.default,
                      dist.group.WORLD.group_name)

    def in_graph(x):
        wait(ar(x, "sum", name))

    rows["compiled-graph all_reduce + wait (kernel)"] = (in_graph, in_graph, (small,), None)
    # The eager functional collective it replaces (Python wrapper, AsyncCollectiveTensor).
    import torch.distributed._functional_collectives as funcol

    def eager_funcol(x):
        funcol.all_reduce(x, "sum", dist.group.WORLD).wait()

    rows["eager funcol.all_reduce + wait"] = (eager_funcol, eager_funcol, (small,), None)
    print(f"{'ns per op: median, middle half of rounds':<40}{'bare':>7}{'added':>7} {'(wall)':>12}{'added':>7} {'(cpu)':>12}")

    results = {}
    for ring in (False, True):
        probe.shutdown()
        probe.cfg = dataclasses.replace(probe.cfg, ring=ring)
        probe.ensure_started()
        sender = probe.sender
        sender._stop.set()  # its timer is replaced by the Flusher; flush() is the same work
        sender._wake.set()
        sender.thread.join()
        flush = Flusher(sender)
        timed(dist.all_reduce, (small,), 2000, flush)  # warm up
        got = measure(rows if not ring else {k: v for k, v in rows.items() if v[3] is None},
                      args.rounds, args.calls, flush, suspended)
        if ring:
            got = {f"{name}, crash ring on": v for name, v in got.items()}
        report(got)
        results.update(got)
    probe.shutdown()
    worst = max(med(wall) for name, (_, wall, _) in results.items() if name in cases)
    worst_cpu = max(med(cpu) for name, (_, _, cpu) in results.items() if name in cases)
    print(f"added per op, probe thread included, crash ring off (worst of {len(cases)} ops): {worst:.0f} ns"
          f" (cpu {worst_cpu:.0f} ns)")


if __name__ == "__main__":
    main()

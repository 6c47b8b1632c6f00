"""What each part of the probe's per-op cost pays for: a staircase of wrappers
around the bare fake-backend all_reduce, each adding one piece of what the real hot
path (commviz/probe/patch.py, _fast_wrapper, crash ring off) does on the caller's
thread; then the real wrapper on the caller's thread alone; then the probe thread's
part, split into its derive (probe/derive.py: group, seq, tensor fields, the start
and end records) and its encode.

Steps 1-5 are a model of the hot path, written out here: if patch.py changes shape,
update them. Interleaved rounds, paired medians, as bench/overhead.py; CPU time of
the thread doing the work.

    python bench/overhead_costs.py [--rounds 40] [--calls 2000]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import tempfile
import threading
import time

from overhead import floors, med, spread


def staircase(orig, probe_like):
    """Cumulative wrappers: each step adds one piece of the hot path (and so repeats
    the step before it: a model, not code to share)."""
    import torch

    clock, q = time.monotonic_ns, collections.deque()
    append, ids, cuda, cap = q.append, itertools.count(), torch.cuda, 65536

    tls, p = threading.local(), probe_like
    tls.s = [0, False, 0, None]  # this thread's, as probe/core.py's thread_state makes it
    passthrough, clocks, clear_floor = floors(orig)

    def guard(*args, **kwargs):
        try:
            st = tls.s
        except AttributeError:
            st = None
        if st[0]:
            return orig(*args, **kwargs)
        t0 = clock()
        st[0] = 1
        r = orig(*args, **kwargs)
        st[0] = 0
        append((t0, clock()))
        return r

    def gate(*args, **kwargs):
        try:
            st = tls.s
        except AttributeError:
            st = None
        if st[0]:
            return orig(*args, **kwargs)
        if not p.deferred or cuda._initialized:
            return orig(*args, **kwargs)
        if len(q) >= cap:
            return orig(*args, **kwargs)
        t0 = clock()
        st[0] = 1
        r = orig(*args, **kwargs)
        st[0] = 0
        append((t0, clock()))
        return r

    def item(*args, **kwargs):
        try:
            st = tls.s
        except AttributeError:
            st = None
        if st[0]:
            return orig(*args, **kwargs)
        if not p.deferred or cuda._initialized:
            return orig(*args, **kwargs)
        if len(q) >= cap:
            return orig(*args, **kwargs)
        it = [None, clock(), args, kwargs, None, None, next(ids)]
        append(it)
        st[0] = 1
        r = orig(*args, **kwargs)
        st[0] = 0
        if r is None and st[3] is None:
            it[4] = clock()
        return r

    return [
        ("1 pass-through wrapper (*args, **kwargs)", passthrough),
        ("2 + two clock reads, one tuple append", clocks),
        ("3 + nesting guard", guard),
        ("4 + deferred/CUDA gate, queue cap", gate),
        ("5 + the item: list of the raw call, op id", item),
    ], lambda: (q.clear(), clear_floor())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()

    os.environ["COMMVIZ_ADDR"] = f"ipc://{tempfile.mkdtemp()}/nobody.sock"
    os.environ["COMMVIZ_RING"] = "0"
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
    probe.ensure_started()
    sender = probe.sender
    sender._stop.set()  # drained and encoded by hand below, on this thread
    sender._wake.set()
    sender.thread.join()
    if probe.sampler is not None:
        probe.sampler.stop()  # its samples would land in the timed drains
    small = torch.ones(256)
    bare = dist.all_reduce._commviz_original
    dist.all_reduce(small)  # the group is known from here on
    import types

    steps, clear = staircase(bare, types.SimpleNamespace(deferred=True))
    probe_q = probe.queue

    def cpu(f, calls):
        c0 = time.thread_time_ns()
        for _ in range(calls):
            f(small)
        return (time.thread_time_ns() - c0) / calls

    real, derive, encode = ("6 the real wrapper, caller's thread", "7 + the probe thread's derive (drain)",
                            "8 + its encode")
    one_by_one = "7 without runs: derive call by call"
    got = {name: [] for name, _ in steps}
    got.update({real: [], derive: [], encode: [], one_by_one: []})
    mx = dist.ReduceOp.MAX

    def alternating(t):  # no two calls alike in a row: probe/derive.py's run path never applies
        dist.all_reduce(t)
        dist.all_reduce(t, mx)
    for _ in range(args.rounds):
        with suspended():
            for name, f in steps:
                b = cpu(bare, args.calls)
                got[name].append(cpu(f, args.calls) - b)
                clear()
            b = cpu(bare, args.calls)
        probe_q.clear()
        sender.flush()
        caller = cpu(dist.all_reduce, args.calls) - b
        c0 = time.thread_time_ns()
        events = sender._drain()
        drained = (time.thread_time_ns() - c0) / args.calls
        c0 = time.thread_time_ns()
        sender._emit(events)
        encoded = (time.thread_time_ns() - c0) / args.calls
        got[real].append(caller)
        got[derive].append(caller + drained)
        got[encode].append(caller + drained + encoded)
        probe_q.clear()
        for _ in range(args.calls // 2):
            alternating(small)
        c0 = time.thread_time_ns()
        sender._drain()
        got[one_by_one].append(caller + (time.thread_time_ns() - c0) / (args.calls // 2 * 2))
    print(f"{'added cpu ns per all_reduce (median, middle half)':<52}{'added':>7} {'spread':>12}")
    prev = 0.0
    for name, diffs in got.items():
        m = med(diffs)
        if name == one_by_one:
            print(f"{name:<52}{m:>7.0f} {spread(diffs):>12} (+{m - med(got[real]):.0f} over 6)")
            continue
        step = f"(+{m - prev:.0f})" if name[0] in "234578" else ""
        print(f"{name:<52}{m:>7.0f} {spread(diffs):>12} {step}")
        prev = m
    probe.shutdown()


if __name__ == "__main__":
    main()

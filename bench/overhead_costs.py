"""What each part of the probe's per-op cost pays for: a staircase of wrappers
around the bare fake-backend all_reduce, each adding one piece of what the real hot
path (commviz/probe/patch.py, _fast_wrapper) does, then the real wrapper on the
caller's thread alone, then with the probe thread's drain and encode.

Steps 1-4 are a model of the hot path, written out here: if patch.py changes
shape, update them. Interleaved rounds, paired medians, as bench/overhead.py.

    python bench/overhead_costs.py [--rounds 40] [--calls 2000]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import threading
import time

from overhead import floors, med, spread, stopped_fake_probe


def staircase(orig, probe_like):
    """Cumulative wrappers: each step adds one piece of the hot path (and so repeats
    the step before it: a model, not code to share)."""
    import torch

    clock, q = time.monotonic_ns, collections.deque()
    append, ids, cuda, Tensor = q.append, itertools.count(), torch.cuda, torch.Tensor

    tls, p = threading.local(), probe_like
    tls.s = [0, False, 0, None]  # this thread's, as probe/core.py's thread_state makes it
    passthrough, clocks, clear_floor = floors(orig)

    def guard(*args, **kwargs):
        try:
            st = tls.s
        except AttributeError:
            st = None
        if st[0] or not p.started:
            return orig(*args, **kwargs)
        t0 = clock()
        st[0] = 1
        r = orig(*args, **kwargs)
        st[0] = 0
        append((t0, clock()))
        return r

    def fields(*args, **kwargs):
        try:
            st = tls.s
        except AttributeError:
            st = None
        if st[0] or not p.started:
            return orig(*args, **kwargs)
        n = len(args)
        x, group = args[0], args[2] if n > 2 else None
        is_async, red = n > 3 and bool(args[3]), "SUM" if n <= 1 else str(args[1])
        g = p.default_group if group is None else None
        seq = g.seq
        g.seq = seq + 1
        op_id = next(ids)
        t0 = clock()
        st[0] = 1
        r = orig(*args, **kwargs)
        st[0] = 0
        append((t0, clock(), x, op_id, seq, is_async, red))
        return r

    def records(*args, **kwargs):
        try:
            st = tls.s
        except AttributeError:
            st = None
        if st[0] or not p.started:
            return orig(*args, **kwargs)
        n = len(args)
        x, group = args[0], args[2] if n > 2 else None
        is_async, red = n > 3 and bool(args[3]), "SUM" if n <= 1 else str(args[1])
        g = p.default_group if group is None else None
        seq = g.seq
        g.seq = seq + 1
        op_id = next(ids)
        if p.ring_start is None and type(x) is Tensor and not cuda._initialized:
            start = ["start", op_id, clock(), "all_reduce", g.gid, seq, x, "", (), -1, -1, is_async, red]
        if len(q) < 65536:
            append(start)
        st[0] = 1
        r = orig(*args, **kwargs)
        st[0] = 0
        if r is None and st[3] is None:
            append(("end", op_id, clock(), "", -1, -1))
        return r

    return [
        ("1 pass-through wrapper (*args, **kwargs)", passthrough),
        ("2 + two clock reads, one tuple append", clocks),
        ("3 + nesting guard, started check", guard),
        ("4 + args by position, group, seq, op id", fields),
        ("5 + start record (deferred), end record", records),
    ], lambda: (q.clear(), clear_floor())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    probe, sender, suspended = stopped_fake_probe()  # flushed by hand below, on this thread
    small = torch.ones(256)
    bare = dist.all_reduce._commviz_original
    dist.all_reduce(small)  # the group is known from here on
    import types

    model = types.SimpleNamespace(started=True, default_group=probe.default_group, ring_start=None)
    steps, clear = staircase(bare, model)
    probe_q = probe.queue

    def real_caller_only(*a):
        r = dist.all_reduce(*a)
        return r

    def cpu(f, calls):
        c0 = time.thread_time_ns()
        for _ in range(calls):
            f(small)
        return (time.thread_time_ns() - c0) / calls

    got = {name: [] for name, _ in steps}
    got["6 the real wrapper, caller's thread"] = []
    got["7 the real wrapper + probe thread's drain, encode"] = []
    for _ in range(args.rounds):
        with suspended():
            for name, f in steps:
                b = cpu(bare, args.calls)
                got[name].append(cpu(f, args.calls) - b)
                clear()
            b = cpu(bare, args.calls)
        got["6 the real wrapper, caller's thread"].append(cpu(real_caller_only, args.calls) - b)
        probe_q.clear()
        c0 = time.thread_time_ns()
        for _ in range(args.calls):
            dist.all_reduce(small)
        sender.flush()
        got["7 the real wrapper + probe thread's drain, encode"].append((time.thread_time_ns() - c0) / args.calls - b)
    print(f"{'added cpu ns per all_reduce (median, middle half)':<52}{'added':>7} {'spread':>12}")
    prev = 0.0
    for name, diffs in got.items():
        m = med(diffs)
        step = f"(+{m - prev:.0f})" if name[0] in "2345" else ""
        print(f"{name:<52}{m:>7.0f} {spread(diffs):>12} {step}")
        prev = m
    probe.shutdown()


if __name__ == "__main__":
    main()

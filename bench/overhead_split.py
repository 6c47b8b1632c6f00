"""Where the probe's time per op goes, in wall time: on the calling thread, and in
each step of the flush that later sends what it queued (drain, frame encoding,
freeing the records), on torch's `fake` backend with the sender's thread stopped
and the flush run here, after every block of calls as bench/overhead.py does.

    python bench/overhead_split.py [--op all_reduce|send|all_gather_into_tensor] [--rounds 40] [--calls 2000]

The calling thread's figure is the instrumented call less the bare one in the same
round; the minimal recorder (two clock reads and one tuple append) is printed beside
it. `encode, warm` packs the same records again at once: the difference from
`encode` is the cost of reading records that the calls since have pushed out of the
caches. The last step is the flush's turn at the socket with no watcher listening:
acks polled, a resync tried. Wall time, so run it on a quiet box and compare rows of
one run. Each encode cuts runs of MAX_BATCH events first, as the sender does.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="all_reduce", choices=("all_reduce", "send", "all_gather_into_tensor"))
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    from commviz.events import cuts, encode_frames
    from commviz.probe.sender import MAX_BATCH
    from overhead import stopped_fake_probe

    probe, sender, suspended = stopped_fake_probe(stop_sampler=True)
    x, out = torch.ones(256), torch.empty(1024)
    fn, fargs = {"all_reduce": (dist.all_reduce, (x,)), "send": (dist.send, (x, 1)),
                 "all_gather_into_tensor": (dist.all_gather_into_tensor, (out, x))}[args.op]
    orig, clock, q = fn._commviz_original, time.monotonic_ns, collections.deque()
    app = q.append

    def minimal(*a):
        t0 = clock()
        r = orig(*a)
        app((t0, clock()))
        return r

    def block(f) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(args.calls):
            f(*fargs)
        return (time.perf_counter_ns() - t0) / args.calls

    def encode(events) -> list:
        """As the sender's flush does: runs of at most MAX_BATCH events, each framed."""
        frames, lo = [], 0
        for hi in cuts(events, MAX_BATCH):
            frames += encode_frames(0, events[lo:hi])
            lo = hi
        return frames

    for _ in range(3000):
        fn(*fargs)
    sender.flush()
    rows = collections.defaultdict(list)
    n = args.calls
    for _ in range(args.rounds):
        with suspended():
            bare = block(orig)
            rows["minimal recorder, its calls"].append(block(minimal) - bare)
            q.clear()
        rows["probe, the calling thread"].append(block(fn) - bare)
        t0 = time.perf_counter_ns()
        events = sender._drain()
        t1 = time.perf_counter_ns()
        frames = encode(events)
        t2 = time.perf_counter_ns()
        frames = encode(events)
        t3 = time.perf_counter_ns()
        del events, frames
        t4 = time.perf_counter_ns()
        sender._send_backlog()
        t5 = time.perf_counter_ns()
        rows["probe, the flush: drain"].append((t1 - t0) / n)
        rows["probe, the flush: encode"].append((t2 - t1) / n)
        rows["  (encode, warm: the same records again)"].append((t3 - t2) / n)
        rows["probe, the flush: records freed"].append((t4 - t3) / n)
        rows["probe, the flush: the watcher's socket (none here)"].append((t5 - t4) / n)
    print(f"{args.op}, ns per op (median over {args.rounds} rounds of {n} calls)")
    for name, v in rows.items():
        print(f"{name:<52}{statistics.median(v):>7.0f}")
    probe.shutdown()


if __name__ == "__main__":
    main()

"""A synthetic trace exactly as the probe writes it, for benches and tests.

    python bench/synth.py --ranks 256 --ops 5000 -o /tmp/big.cvz [--bytes 4194304]

Each rank says hello (its own host's monotonic clock: 8 ranks a host), announces the
world group, then runs `--ops` ring all_reduce instances: it enters with a skew of a
few tens of microseconds (one rank a slow one now and then), every member leaves once
the last has arrived and the ring has moved the bytes, and the next step starts after
a little compute. Frames are the probe's (`encode_batch` of a run of one rank's
events, a flush every `--flush-ms` of job time, a Counters every second), written
with the real `TraceWriter` in the order a watcher records them: by flush time.
Ends with a goodbye from every rank. The last line printed is the figure:
events, bytes and bytes per event.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commviz.events import Counters, Goodbye, GroupDef, Hello, OpEnd, OpStart, encode_batch  # noqa: E402
from commviz.trace.file import TraceWriter  # noqa: E402

RANKS_PER_HOST = 8
WALL0 = 1_780_000_000_000_000_000  # a fixed wall clock start: traces are reproducible
GROUP = "0"


def hello(rank: int, world: int, mono0: int) -> Hello:
    return Hello(rank=rank, local_rank=rank % RANKS_PER_HOST, world_size=world,
                 host=f"node{rank // RANKS_PER_HOST}", pid=10_000 + rank, backend="gloo", device="cpu",
                 torch_version="2.13.0", commviz_version="0.1.0", job="synth",
                 mono_ns=mono0, wall_ns=WALL0)


def host_mono0(rank: int) -> int:
    """Each host's monotonic clock started at its own boot."""
    return 1_000_000_000_000 * (1 + rank // RANKS_PER_HOST)


def frames(ranks: int, ops: int, nbytes: int = 4 << 20, flush_ms: float = 20.0,
           seed: int = 0) -> Iterator[tuple[int, list]]:
    """(rank, events) frames in the order a watcher would record them."""
    rng = random.Random(seed)
    flush_ns = int(flush_ms * 1e6)
    mono0 = [host_mono0(r) for r in range(ranks)]
    pending: list[list] = [[hello(r, ranks, mono0[r]), GroupDef(GROUP, list(range(ranks)), "gloo", "default_pg")]
                           for r in range(ranks)]
    next_flush = flush_ns
    last_counters = 0
    shape = [nbytes // 4]
    transfer = int(2 * (ranks - 1) / ranks * nbytes / 10.0) + 5_000  # ring at ~10 GB/s
    t = 0  # job time (ns since start), the same instant on every host
    for seq in range(ops):
        arrive = [t + rng.randrange(2_000, 40_000) for _ in range(ranks)]
        if rng.random() < 0.02:
            arrive[rng.randrange(ranks)] += rng.randrange(100_000, 2_000_000)  # a straggler
        done = max(arrive) + transfer
        for r in range(ranks):
            ev = pending[r]
            ev.append(OpStart(id=seq, t=mono0[r] + arrive[r], op="all_reduce", group=GROUP, seq=seq, bytes=nbytes,
                              dtype="float32", shape=shape, reduce_op="sum"))
            ev.append(OpEnd(id=seq, t=mono0[r] + done + rng.randrange(0, 3_000)))
        t = done + rng.randrange(50_000, 400_000)  # compute before the next step
        if t >= next_flush:
            counters = t - last_counters >= 1_000_000_000
            for r in range(ranks):
                if counters:
                    pending[r].append(Counters(mono0[r] + t))
                yield r, pending[r]
                pending[r] = []
            last_counters = t if counters else last_counters
            next_flush = t + flush_ns
    for r in range(ranks):
        pending[r].append(Counters(mono0[r] + t))
        pending[r].append(Goodbye(mono0[r] + t + 1000))
        yield r, pending[r]


def write(path: str, ranks: int, ops: int, **kw) -> tuple[int, int]:
    """Write the trace; returns (events, file bytes)."""
    w = TraceWriter(path)
    events = 0
    try:
        for rank, evs in frames(ranks, ops, **kw):
            events += len(evs)
            w.write(encode_batch(rank, evs))
    finally:
        w.close()
    return events, os.path.getsize(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--ops", type=int, default=1000, help="all_reduce steps per rank")
    ap.add_argument("--bytes", type=int, default=4 << 20, help="bytes per all_reduce (default 4 MiB)")
    ap.add_argument("--flush-ms", type=float, default=20.0, help="the probe's flush interval, in job time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--output", required=True, metavar="FILE")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    events, size = write(a.output, a.ranks, a.ops, nbytes=a.bytes, flush_ms=a.flush_ms, seed=a.seed)
    dt = time.perf_counter() - t0
    print(f"{a.output}: {a.ranks} ranks x {a.ops} all_reduce, written in {dt:.1f} s")
    print(f"{events} events, {size} bytes, {size / max(events, 1):.1f} bytes/event")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A real 2-rank gloo job, uninstrumented (COMMVIZ=0) vs streaming to a live
watcher, alternated so machine noise hits both alike. Prints the per-step time the
job itself measures (scenarios/allreduce.py) and the slowdown.

    python bench/e2e.py [--runs 4] [--iters 2000] [--numel 256]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def job(env: dict, iters: int, numel: int) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           os.path.join(REPO, "scenarios", "allreduce.py"), "--iters", str(iters), "--numel", str(numel)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"\(([\d.]+) µs per step\)", out).group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--numel", type=int, default=256)
    args = ap.parse_args()
    from commviz.watcher import LiveFeed

    d = tempfile.mkdtemp()
    os.chmod(d, 0o700)
    addr = f"ipc://{d}/bench.sock"
    feed = LiveFeed(addr).start()
    base = dict(os.environ, COMMVIZ_ADDR=addr)
    off, on = [], []
    try:
        for _ in range(args.runs):
            off.append(job(dict(base, COMMVIZ="0"), args.iters, args.numel))
            on.append(job(base, args.iters, args.numel))
            time.sleep(0.2)
    finally:
        feed.close()
    o, i = statistics.median(off), statistics.median(on)
    print(f"2-rank gloo all_reduce of {args.numel * 4} B, {args.iters} steps, median of {args.runs} runs each")
    print(f"  uninstrumented : {o:8.1f} µs/step   runs {', '.join(f'{x:.0f}' for x in off)}")
    print(f"  instrumented   : {i:8.1f} µs/step   runs {', '.join(f'{x:.0f}' for x in on)}")
    print(f"  added          : {i - o:8.1f} µs/step ({(i / o - 1) * 100:+.1f}%)")
    feed.drain()
    with feed.lock:
        counts = [r.per_op.get("all_reduce", [0])[0] for r in feed.model.ranks.values()]
    print(f"  watcher saw    : {counts} all_reduce per rank in the last run (expected {args.iters})")


if __name__ == "__main__":
    main()

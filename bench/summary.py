"""`commviz summary --json TRACE` timed as a user runs it: wall-clock, CPU of the
command and every process it started, and the peak resident memory of the whole
process tree (sampled every 10 ms: a command that starts a helper process is
measured whole).

    python bench/synth.py --ranks 256 --ops 5000 -o /tmp/t256.cvz
    python bench/summary.py /tmp/t256.cvz [--runs 2] [--sides]

One line per run, ending in events per second of wall-clock. commviz's modules are
compiled to bytecode first, as `pip install` leaves them: where PYTHONDONTWRITEBYTECODE
is set (this box sets it) an editable install would compile them again on every run,
0.1 s that is not the summary's.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import psutil

import commviz


class TreeRss:
    """The resident memory of a process and every process under it. The processes
    under it are looked up every tenth sample: psutil's `children()` reads every
    process on the machine, 2 ms of CPU here, which at 100 samples a second would take
    a fifth of a core from the command being timed."""

    def __init__(self, p: psutil.Process) -> None:
        self.p, self.tree, self.n = p, [p], 0

    def __call__(self) -> int:
        if self.n % 10 == 0:
            try:
                self.tree = [self.p, *self.p.children(recursive=True)]
            except psutil.Error:
                pass
        self.n += 1
        total = 0
        for q in self.tree:
            try:
                total += q.memory_info().rss
            except psutil.Error:
                pass
        return total


def run_once(trace: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, "-m", "commviz.cli", "summary", "--json", trace],
                                stdout=out, stderr=subprocess.DEVNULL)
        rss, peak = TreeRss(psutil.Process(proc.pid)), 0
        while proc.poll() is None:
            peak = max(peak, rss())
            time.sleep(0.01)
        wall = time.perf_counter() - t0
        out.seek(0)
        doc = json.load(out)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"summary failed with exit code {proc.returncode}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "peak_mb": peak / 2**20, "events": doc["events"]}


def sides(trace: str) -> str:
    """The two sides of the summary's split, each timed in itself: the child that
    reads, decodes and merges (`trace/readahead.py`), and this process, which scans
    first and then ingests."""
    from commviz.commands._trace import open_stream
    from commviz.model import Model, traces
    from commviz.trace import readahead

    merge = readahead._child

    def timed_child(*a):
        c0 = time.process_time()
        try:
            return merge(*a)
        finally:
            print(f"  child (read, decode, merge): {time.process_time() - c0:.2f} s CPU", file=sys.stderr)

    readahead._child = timed_child
    t0 = time.perf_counter()
    s = open_stream(trace, note=False)
    t1, c1 = time.perf_counter(), time.process_time()
    traces.ingest_chunks(Model(hang_after_s=1.0, flows=False), readahead.chunks(s))
    return (f"  this process: first pass {t1 - t0:.2f} s; ingest {time.process_time() - c1:.2f} s CPU, "
            f"{time.perf_counter() - t1:.2f} s wall")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--sides", action="store_true", help="also time each side of the split, in this process")
    args = ap.parse_args(argv)
    compileall.compile_dir(os.path.dirname(commviz.__file__), quiet=1)
    if args.sides:
        print(sides(args.trace), file=sys.stderr)
    for _ in range(args.runs):
        r = run_once(args.trace)
        print(f"{r['events']:,} events  {r['wall_s']:.2f} s wall  {r['cpu_s']:.2f} s CPU  "
              f"peak {r['peak_mb']:.0f} MB (whole tree)  {r['events'] / r['wall_s'] / 1e6:.2f}M events/s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())

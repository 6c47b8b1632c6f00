"""The job's cost of a watcher that is frozen (SIGSTOP) for the whole run, against
no watcher at all: a 2-rank gloo all_reduce loop, alternated so noise hits both.

    python bench/faults.py [--runs 3] [--iters 2000]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e import job  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--numel", type=int, default=256)
    args = ap.parse_args()
    d = tempfile.mkdtemp()
    os.chmod(d, 0o700)
    absent = dict(os.environ, COMMVIZ_ADDR=f"ipc://{d}/nobody.sock")
    frozen_addr = f"ipc://{d}/frozen.sock"
    frozen = dict(os.environ, COMMVIZ_ADDR=frozen_addr)
    watcher = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "integration", "jobs", "headless_watcher.py"),
                                frozen_addr, os.path.join(d, "w.json")], stdout=subprocess.PIPE, text=True)
    watcher.stdout.readline()
    watcher.send_signal(signal.SIGSTOP)
    none_t, frozen_t = [], []
    try:
        for _ in range(args.runs):
            none_t.append(job(absent, args.iters, args.numel))
            frozen_t.append(job(frozen, args.iters, args.numel))
            time.sleep(0.2)
    finally:
        watcher.send_signal(signal.SIGCONT)
        watcher.kill()
    a, b = statistics.median(none_t), statistics.median(frozen_t)
    print(f"2-rank gloo all_reduce of {args.numel * 4} B, {args.iters} steps, median of {args.runs} runs each")
    print(f"  no watcher     : {a:8.1f} µs/step   runs {', '.join(f'{x:.0f}' for x in none_t)}")
    print(f"  frozen watcher : {b:8.1f} µs/step   runs {', '.join(f'{x:.0f}' for x in frozen_t)}")
    print(f"  slowdown       : {(b / a - 1) * 100:+.1f}%  (target <= 2%)")


if __name__ == "__main__":
    main()

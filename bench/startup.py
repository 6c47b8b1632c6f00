"""What commviz adds to a rank's start-up: a one-rank gloo job started again and again,
plainly and under commviz's start-up hook (as `commviz record/watch -- CMD` starts
it), alternating, each timed from its spawn to four points:

- `import torch.distributed` done (the probe patches torch.distributed here);
- `init_process_group` returned (the probe starts: its thread, its socket);
- the first all_reduce returned;
- the process gone (the probe flushes and says goodbye at exit).

    python bench/yardstick.py && python bench/startup.py --runs 15

Medians, and the difference under commviz. Nobody listens on the probe's address,
so no collector shares the two cores with the job.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

JOB = r"""
import json, sys, time
import torch
t_torch = time.time()
import torch.distributed as dist
t_dist = time.time()
dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
t_init = time.time()
dist.all_reduce(torch.ones(4))
t_op = time.time()
print(json.dumps({"import torch": t_torch, "import torch.distributed": t_dist, "init_process_group": t_init,
                  "first all_reduce": t_op, "modules": len(sys.modules)}))
dist.destroy_process_group()
"""
POINTS = ("import torch", "import torch.distributed", "init_process_group", "first all_reduce", "exit")


def one(env: dict) -> dict[str, float]:
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True, text=True, timeout=120)
    t_exit = time.time()
    if p.returncode != 0:
        raise SystemExit(p.stderr[-2000:])
    got = json.loads(p.stdout.strip().splitlines()[-1])
    out = {k: (got[k] - t0) * 1e3 for k in POINTS[:-1]}
    out["exit"] = (t_exit - t0) * 1e3
    out["modules"] = got["modules"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="runs of each, alternating")
    args = ap.parse_args()
    from commviz.launch import job_env

    base = {k: v for k, v in os.environ.items() if not k.startswith("COMMVIZ")}
    sock = tempfile.mkdtemp(prefix="cv-startup-")
    envs = {"plain": base, "commviz": job_env(f"ipc://{sock}/nobody.sock", base)}
    got: dict[str, list[dict]] = {m: [] for m in envs}
    one(envs["plain"])  # warm the page cache
    for _ in range(args.runs):
        for mode, env in envs.items():
            got[mode].append(one(env))
    print(f"{args.runs} runs each, ms from spawn (median); modules loaded at the end")
    print(f"{'':26s}{'plain':>9s}{'commviz':>9s}{'added':>9s}")
    for k in (*POINTS, "modules"):
        a, b = (statistics.median(r[k] for r in got[m]) for m in envs)
        print(f"{k:26s}{a:9.0f}{b:9.0f}{b - a:+9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`commviz demo`: the dashboard and a small CPU job (scenarios/allreduce.py), one command."""

from __future__ import annotations

import argparse
import os

import commviz
from commviz import launch
from commviz.commands.base import Command
from commviz.commands.watch import watch
from commviz.errors import CommvizError


def demo_script() -> str | None:
    here = os.path.dirname(os.path.abspath(commviz.__file__))
    for cand in (os.path.join(here, "scenarios", "allreduce.py"),
                 os.path.join(os.path.dirname(here), "scenarios", "allreduce.py")):
        if os.path.exists(cand):
            return cand
    return None


def add_arguments(p) -> None:
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--iters", type=int, default=600)
    p.add_argument("--numel", type=int, default=1 << 16)
    p.add_argument("--interval", type=float, default=0.05)
    p.add_argument("--hang-after", type=float, default=10.0, help=argparse.SUPPRESS)


def run(args, cmd: list[str]) -> int:
    script = demo_script()
    if script is None:
        raise CommvizError("the demo needs scenarios/allreduce.py from a source checkout (pip install -e .)")
    job_cmd = launch.torchrun(args.nproc, script, "--iters", str(args.iters), "--numel", str(args.numel),
                              "--interval", str(args.interval))
    return watch(job_cmd, hang_after_s=args.hang_after)


COMMAND = Command("demo", "dashboard + a small CPU job, one command", add_arguments, run)

"""`commviz demo`: the course's first lesson (an all_reduce on CPU ranks) under the
dashboard, one command."""

from __future__ import annotations

import argparse

from commviz import lessons
from commviz.commands.base import Command
from commviz.commands.lesson import run_lesson
from commviz.errors import CommvizError


def add_arguments(p) -> None:
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--iters", type=int, default=600)
    p.add_argument("--numel", type=int, default=1 << 16)
    p.add_argument("--interval", type=float, default=0.05)
    p.add_argument("--hang-after", type=float, default=10.0, help=argparse.SUPPRESS)


def run(args, cmd: list[str]) -> int:
    course = lessons.lessons()
    if not course:
        raise CommvizError(f"no lessons in {lessons.SCENARIO_DIR}: this install lacks the scenarios; reinstall commviz")
    flags = ["--iters", str(args.iters), "--numel", str(args.numel), "--interval", str(args.interval)]
    return run_lesson(course[0], args.nproc, None, args.hang_after, flags)


COMMAND = Command("demo", "the first lesson: dashboard + a small CPU job, one command", add_arguments, run)

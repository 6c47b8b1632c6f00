"""The course: the scenarios the package carries (`commviz/scenarios/`, the repo's
`scenarios/` in a source checkout), in teaching order, each with what it teaches and
how to run it so that there is something to watch.

What a lesson teaches is the first paragraph of its script's docstring, read without
importing the script (they import torch): the scripts stay the one place it is said.
"""

from __future__ import annotations

import ast
import difflib
import os
from dataclasses import dataclass


SCENARIO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios")
WATCH = ("--interval", "0.2", "--iters", "100")  # slow enough to follow, long enough to look


@dataclass(frozen=True)
class Lesson:
    name: str
    path: str
    teaches: str  # one line
    nproc: int = 4
    args: tuple[str, ...] = WATCH  # the script's flags for watching it; the user's own come after
    hang_after_s: float = 10.0


# name -> (ranks, script flags, seconds before the dashboard calls a wait a hang)
COURSE: dict[str, tuple[int, tuple[str, ...], float]] = {
    "allreduce": (4, ("--iters", "600", "--numel", str(1 << 16), "--interval", "0.05"), 10.0),
    "p2p": (4, WATCH, 10.0),
    "broadcast": (4, WATCH, 10.0),
    "scatter_gather": (4, WATCH, 10.0),
    "reduce": (4, WATCH, 10.0),
    "ring_allreduce": (4, WATCH, 10.0),
    "fabrics": (4, ("--iters", "300", "--interval", "0.1"), 10.0),
    "all_gather": (4, WATCH, 10.0),
    "reduce_scatter": (4, WATCH, 10.0),
    "all_to_all": (4, WATCH, 10.0),
    "ddp_train": (4, ("--bucket-cap-mb", "1", *WATCH), 10.0),
    "fsdp_train": (4, WATCH, 10.0),
    "mixed_precision": (4, WATCH, 10.0),
    "overlap": (4, ("--iters", "100"), 10.0),
    "hang": (4, (), 3.0),
    "p2p_deadlock": (2, (), 3.0),
    "desync": (2, ("--mismatch", "op"), 3.0),
    "crash": (3, (), 3.0),
    "straggler": (4, ("--iters", "400"), 10.0),
}


def teaches(path: str) -> str:
    """The first paragraph of the script's docstring, on one line ("" without one)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = ast.get_docstring(ast.parse(f.read(), filename=path)) or ""
    except (OSError, SyntaxError, ValueError):
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def lessons(directory: str = SCENARIO_DIR) -> list[Lesson]:
    """Every scenario in `directory`: the course's in its order, then any others by
    name (a new script is a lesson as soon as it is there)."""
    try:
        names = {f[:-3] for f in os.listdir(directory) if f.endswith(".py") and not f.startswith("_")}
    except OSError:
        return []
    order = [n for n in COURSE if n in names] + sorted(names - set(COURSE))
    out = []
    for name in order:
        path = os.path.join(directory, name + ".py")
        nproc, args, hang_after = COURSE.get(name, (4, WATCH, 10.0))
        out.append(Lesson(name, path, teaches(path), nproc, args, hang_after))
    return out


class UnknownLesson(LookupError):
    pass


def find(name: str, directory: str = SCENARIO_DIR) -> Lesson:
    """The lesson called `name` (a trailing .py is fine). Raises UnknownLesson naming
    the closest ones."""
    name = os.path.basename(name)
    name = name[:-3] if name.endswith(".py") else name
    known = lessons(directory)
    for lesson in known:
        if lesson.name == name:
            return lesson
    close = difflib.get_close_matches(name, [known_lesson.name for known_lesson in known], n=3)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise UnknownLesson(f"no lesson called {name!r}{hint} (`commviz lesson` lists them)")

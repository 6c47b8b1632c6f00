"""`commviz lesson [NAME]`: the course the package carries. Without a name it lists
the lessons; with one it runs that scenario under the dashboard (torchrun inside, as
`watch -- CMD` does), with flags that make it worth watching and the user's own
script flags after `--`."""

from __future__ import annotations

import shutil
import sys

from commviz import launch, lessons
from commviz.commands.base import TOPOLOGY_HELP, Command
from commviz.commands.watch import watch
from commviz.errors import CommvizError

USAGE = "commviz lesson NAME [--nproc N] [--topology PRESET] [-- script args]"


def add_arguments(p) -> None:
    p.add_argument("name", nargs="?", metavar="NAME", help="the lesson to run (none: list them)")
    p.add_argument("--nproc", type=int, metavar="N", help="ranks (default: the lesson's, mostly 4)")
    p.add_argument("--topology", metavar="PRESET",
                   help=TOPOLOGY_HELP + "; CPU ranks are placed on its GPUs (simulated)")
    p.add_argument("--hang-after", type=float, metavar="S",
                   help="seconds in one op before a rank shows as hung (default: the lesson's)")


def run(args, cmd: list[str]) -> int:
    if not args.name:
        print_course(sys.stdout)
        return 0
    try:
        lesson = lessons.find(args.name)
    except lessons.UnknownLesson as exc:
        raise CommvizError(str(exc)) from exc
    return run_lesson(lesson, args.nproc, args.topology, args.hang_after, list(lesson.args) + cmd)


def run_lesson(lesson: lessons.Lesson, nproc: int | None, topology: str | None, hang_after_s: float | None,
               script_args: list[str]) -> int:
    nproc = nproc or lesson.nproc
    if nproc < 1:
        raise CommvizError("--nproc must be at least 1")
    job_cmd = launch.torchrun(nproc, lesson.path, *script_args)
    hang = lesson.hang_after_s if hang_after_s is None else hang_after_s
    return watch(job_cmd, topology=topology, hang_after_s=hang, title=f"commviz lesson {lesson.name}")


def print_course(out) -> None:
    course = lessons.lessons()
    if not course:
        raise CommvizError(f"no lessons in {lessons.SCENARIO_DIR}: this install lacks the scenarios; "
                           "reinstall commviz")
    width = shutil.get_terminal_size((100, 24)).columns if out.isatty() else 0
    pad = max(len(lesson.name) for lesson in course) + 2
    print(f"The course, in order ({USAGE}):\n", file=out)
    for lesson in course:
        line = f"  {lesson.name.ljust(pad)}{lesson.teaches}"
        if width and len(line) > width:
            line = line[: width - 1] + "…"
        print(line, file=out)
    print(f"\nStart with `commviz lesson {course[0].name}`; the scripts are in {lessons.SCENARIO_DIR}.", file=out)


COMMAND = Command(
    "lesson", "list the lessons, or run one under the dashboard", add_arguments, run,
    description="The course: each lesson is a small torchrun job that shows one thing about "
    "distributed communication. `commviz lesson` lists them; `" + USAGE + "` runs one "
    "under the dashboard.",
    takes_cmd=True,
)

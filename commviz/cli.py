"""The `commviz` command: wiring only. Each command lives in `commviz/commands/`
(one module each, registered in `commviz.commands.COMMANDS`); a `CommvizError` a
command raises is printed as `commviz: <message>` and its code is the exit status."""

from __future__ import annotations

import argparse
import sys

import commviz
from commviz.commands import BY_NAME, COMMANDS
from commviz.errors import CommvizError

EPILOG = """start here:
  commviz demo                                   dashboard + a 4-rank CPU job, one command
  commviz lesson                                 the course: list the lessons, run one by name
  commviz watch -- torchrun --nproc-per-node 4 scenarios/allreduce.py
  commviz record -o t.cvz -- torchrun --nproc-per-node 4 scenarios/allreduce.py
  commviz summary t.cvz            (or a COMMVIZ_TRACE_DIR of rank-<R>.cvz files)
  commviz replay t.cvz
  commviz summary DIR              (torch's flight-recorder dumps or profiler traces, a file per rank)

A script that calls commviz.instrument() streams to a running `commviz watch`;
`watch/record -- CMD` instrument unmodified scripts too.
Commands, environment and the JSON documents: docs/ARCHITECTURE.md."""


def _split_cmd(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="commviz",
        description="Live torch.distributed traffic in your terminal.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"commviz {commviz.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_to(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, cmd = _split_cmd(argv)
    parser = build_parser()
    args = parser.parse_args(own)
    command = BY_NAME.get(args.command or "")
    if command is None:
        parser.print_help()
        return 2
    try:
        if cmd and not command.takes_cmd:
            raise CommvizError(f"`{command.name}` takes no command after --")
        return command.run(args, cmd)
    except CommvizError as exc:
        print(f"commviz: {exc}", file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())

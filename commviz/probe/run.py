"""`torchrun … -m commviz.run script.py args…`: instrument, then run an unmodified
script (or `-m module`) as __main__."""

from __future__ import annotations

import runpy
import sys

USAGE = """usage: python -m commviz.run SCRIPT.py [ARGS…]
       python -m commviz.run -m MODULE [ARGS…]

Instruments torch.distributed, then runs SCRIPT as __main__. Under torchrun:
  torchrun --nproc-per-node 4 -m commviz.run scenarios/allreduce.py
Events go to `commviz watch` (COMMVIZ_ADDR) and/or COMMVIZ_TRACE_DIR."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    from commviz.probe.autostart import arm

    arm()
    if argv[0] == "-m":
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0

"""`commviz topo [--json] [--preset NAME | --fixture FILE]`: the GPU topology matrix
(like `nvidia-smi topo -m`) and NVLink list of this machine, a preset or a fixture."""

from __future__ import annotations

import json
import sys

from commviz.commands.base import JSON_HELP, Command
from commviz.errors import CommvizError


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", metavar="NAME", help="a shipped machine: dgx-h100, dgx-a100, pcie-2gpu, pcie-4gpu-2socket")
    src.add_argument("--fixture", metavar="FILE", help="a fixture file (from commviz nvml-dump)")


def run(args, cmd: list[str]) -> int:
    from commviz.topo.backend import open_backend
    from commviz.topo.discover import discover
    from commviz.topo.fake import FakeNvml, FixtureError
    from commviz.topo.presets import load_preset, preset_names
    from commviz.topo.render import render_topology

    try:
        if args.preset:
            backend = load_preset(args.preset)
        elif args.fixture:
            backend = FakeNvml.from_file(args.fixture)
        else:
            backend = open_backend()
    except FixtureError as exc:
        raise CommvizError(str(exc)) from exc
    try:
        topo = discover(backend)
    finally:
        backend.close()
    if not backend.available:
        hint = (f"commviz: {backend.reason}; no GPU topology to show here.\n"
                f"  to see a machine's shape anyway: commviz topo --preset dgx-h100"
                f"  (presets: {', '.join(preset_names())})")
        print(hint, file=sys.stderr if args.json else sys.stdout)
        if not args.json:
            return 0
    if args.json:
        print(json.dumps(topo.to_document(), indent=2))
    else:
        print(render_topology(topo), end="")
    return 0


COMMAND = Command("topo", "GPU topology matrix (like nvidia-smi topo -m) and NVLink list", add_arguments, run,
                  description="GPU topology of this machine from NVML, or of a preset or fixture file.")

"""`commviz doctor`: what this install has — versions, which compiled parts are in
use (and why not, where not), the optional tools each command needs — so a report
of "it is slow" or "attach does nothing" starts from facts."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys

from commviz.commands.base import JSON_HELP, Command


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def facts() -> dict:
    from commviz import __version__, native

    # importing these loads their compiled part the way a run does
    import commviz.events  # noqa: F401
    import commviz.model.store  # noqa: F401
    import commviz.probe.sender  # noqa: F401
    import commviz.trace.ring  # noqa: F401
    import commviz.transport.reader

    commviz.transport.reader.fast()  # binds the receive loop to pyzmq's libzmq, or says why not

    def has(mod: str) -> bool:
        return importlib.util.find_spec(mod) is not None

    torch = None
    if has("torch"):
        import torch as torch_mod

        torch = torch_mod.__version__
    return {
        "commviz": __version__,
        "python": sys.version.split()[0],
        "torch": torch,
        "pure": native.pure(),
        "compiled": native.report(),
        "nccl_plugin": _nccl_plugin(),
        "optional": {
            "py-spy (commviz attach)": shutil.which("py-spy") is not None,
            "pyarrow (export --parquet)": has("pyarrow"),
            "prometheus_client (--metrics)": has("prometheus_client"),
            "textual (watch, replay)": has("textual"),
        },
    }


def _nccl_plugin() -> dict:
    """What a job started from this shell would do with NCCL's profiler plugin: the
    same decision the probe makes (probe/nccl_plugin.enable), on a copy of the
    environment, so asking changes nothing."""
    import os

    from commviz.probe import nccl_plugin

    env = dict(os.environ)
    p = nccl_plugin.enable(env)
    return {"state": p.state.value, "why": p.why, "path": p.path,
            "kernel_events": nccl_plugin.kernel_events(env)}


def run(args, cmd: list[str]) -> int:
    f = facts()
    if args.json:
        print(json.dumps(f, indent=2))
        return 0
    print(f"commviz {f['commviz']} · Python {f['python']} · torch {f['torch'] or 'not installed'}")
    print("compiled parts" + (" (COMMVIZ_PURE=1: all off)" if f["pure"] else "") + ":")
    from commviz.native import LIBRARIES, PARTS

    for name, state in f["compiled"].items():
        what = PARTS.get(name) or LIBRARIES[name]
        print(f"  {name.rsplit('.', 1)[1]:<10} {state:<12} {what}" if state in ("loaded", "built")
              else f"  {name.rsplit('.', 1)[1]:<10} {state}  — {what}")
    n = f["nccl_plugin"]
    said = {
        "loaded": "a job started from here loads it into NCCL (NCCL_PROFILER_PLUGIN set by the probe)"
                  + ("" if n["kernel_events"] else "; kernel events off (COMMVIZ_NCCL_KERNEL=0)"),
        "user's plugin": f"not used: {n['why']}",
    }.get(n["state"], f"{n['state']}: {n['why']}")
    print(f"NCCL profiler plugin: {said}")
    print("optional:")
    for what, ok in f["optional"].items():
        print(f"  {'yes' if ok else 'no ':<4} {what}")
    return 0


COMMAND = Command("doctor", "what this install has: versions, compiled parts in use (or why not), optional tools",
                  add_arguments, run)

"""Launching a user's job so that every Python process in it is instrumented."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import commviz

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(commviz.__file__)), "_bootstrap")


def job_env(addr: str, base: dict | None = None, stack_after_s: float | None = None,
            ring_dir: str | None = None) -> dict:
    """The environment for a launched job: our start-up hook first on PYTHONPATH,
    events to `addr`; ranks capture stacks of ops stuck `stack_after_s`, early enough
    for the watcher's hang threshold to show them."""
    env = dict(os.environ if base is None else base)
    if stack_after_s is not None:
        env["COMMVIZ_STACK_AFTER"] = f"{stack_after_s:g}"
    if ring_dir is not None:
        env["COMMVIZ_RING_DIR"] = ring_dir
        env.setdefault("COMMVIZ_RING", "1")  # we are there to read what a crashed rank left
    parts = [BOOTSTRAP_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["COMMVIZ_AUTOSTART"] = "1"
    env["COMMVIZ_ADDR"] = addr
    return env


def resolve(cmd: list[str]) -> list[str]:
    """Fail early, with the fix, when the command does not exist."""
    if not cmd:
        raise SystemExit("commviz: no command after --; e.g. commviz record -o t.cvz -- torchrun --nproc-per-node 2 scenarios/allreduce.py")
    exe = cmd[0]
    if os.sep not in exe and shutil.which(exe) is None:
        hint = " (is torch installed in this environment?)" if exe == "torchrun" else ""
        raise SystemExit(f"commviz: command not found: {exe}{hint}")
    return cmd


def start(cmd: list[str], addr: str, quiet: bool = False, stack_after_s: float | None = None,
          ring_dir: str | None = None) -> subprocess.Popen:
    out = subprocess.DEVNULL if quiet else None
    env = job_env(addr, stack_after_s=stack_after_s, ring_dir=ring_dir)
    return subprocess.Popen(resolve(cmd), env=env, stdout=out, stderr=out)


def torchrun(nproc: int, script: str, *args: str) -> list[str]:
    """A torchrun command line that uses this interpreter's torch."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", script, *args]

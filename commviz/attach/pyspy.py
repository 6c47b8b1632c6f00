"""Every thread's Python stack of a process we did not start, through py-spy (ptrace,
read-only: the process is paused for the few milliseconds of the read).

py-spy is an optional dependency (`pip install 'commviz[attach]'`). It needs ptrace
permission on the target: the same user and `kernel.yama.ptrace_scope` 0 or 1 with
the target a descendant — or root, or CAP_SYS_PTRACE in a container. When it is
refused the error says which of these to change.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass

from commviz.events import Frame

TIMEOUT_S = 20.0
MAX_LOCAL = 80  # characters of a local's repr kept


class AttachError(RuntimeError):
    """Why a process's stacks could not be read, and what to do about it."""


@dataclass(frozen=True)
class ThreadStack:
    name: str
    frames: list[Frame]  # outermost first, as the probe sends them
    locals: list[dict]  # per frame, outermost first: {name: repr}
    active: bool = False


def find_pyspy() -> str | None:
    return shutil.which("py-spy")


def refused_hint() -> str:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        scope = ""
    hint = ("run commviz attach as the job's user with ptrace allowed: "
            "`sudo sysctl kernel.yama.ptrace_scope=0` (or run attach with sudo); "
            "in a container, start it with `--cap-add SYS_PTRACE`")
    return hint + (f" (ptrace_scope is {scope} here)" if scope else "")


def dump(pid: int, exe: str | None = None, timeout_s: float = TIMEOUT_S, with_locals: bool = True) -> list[ThreadStack]:
    """The stacks of every thread of `pid`. Raises AttachError."""
    exe = exe or find_pyspy()
    if exe is None:
        raise AttachError("py-spy is not installed: pip install 'commviz[attach]' (or pip install py-spy)")
    cmd = [exe, "dump", "--pid", str(pid), "--json"] + (["--locals"] if with_locals else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise AttachError(f"py-spy did not answer for pid {pid} within {timeout_s:.0f} s") from None
    except OSError as exc:
        raise AttachError(f"py-spy could not run: {exc}") from None
    if p.returncode != 0:
        err = (p.stderr or p.stdout).strip().splitlines()
        text = err[-1] if err else f"exit status {p.returncode}"
        low = (p.stderr or "").lower()
        if "permission" in low or "operation not permitted" in low or "ptrace" in low:
            raise AttachError(f"ptrace refused for pid {pid} ({text}): {refused_hint()}")
        raise AttachError(f"py-spy failed for pid {pid}: {text}")
    return parse(p.stdout)


def parse(text: str) -> list[ThreadStack]:
    """py-spy's `dump --json`: threads, each with frames innermost first."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise AttachError(f"py-spy's output is not JSON: {exc}") from None
    out = []
    for t in doc if isinstance(doc, list) else []:
        frames, locs = [], []
        for f in reversed(t.get("frames") or []):
            name = str(f.get("name") or "")
            frames.append(Frame(str(f.get("filename") or ""), int(f.get("line") or 0), name.rsplit(".", 1)[-1]))
            locs.append({str(v.get("name")): str(v.get("repr"))[:MAX_LOCAL] for v in f.get("locals") or []
                         if v.get("name") is not None})
        out.append(ThreadStack(str(t.get("thread_name") or t.get("thread_id") or "?"), frames, locs,
                               bool(t.get("active"))))
    return out

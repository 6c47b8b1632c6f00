"""Launching a user's job so that every Python process in it is instrumented."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable

from commviz.errors import CommvizError

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")


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
        raise CommvizError("no command after --; e.g. commviz record -o t.cvz -- torchrun --nproc-per-node 2 "
                           "scenarios/allreduce.py")
    exe = cmd[0]
    if os.sep not in exe and shutil.which(exe) is None:
        hint = " (is torch installed in this environment?)" if exe == "torchrun" else ""
        raise CommvizError(f"command not found: {exe}{hint}")
    return cmd


class Job:
    """A user's job launched with every rank instrumented, streaming to `addr`.

    `log=True` sends its output to a temporary file (`log_path`: the dashboard owns
    the terminal); otherwise it shares ours. `start()` raises CommvizError when the
    command does not exist."""

    def __init__(self, cmd: list[str], addr: str, *, stack_after_s: float | None = None,
                 ring_dir: str | None = None, log: bool = False) -> None:
        self.cmd = cmd
        self.env = job_env(addr, stack_after_s=stack_after_s, ring_dir=ring_dir)
        self.log = log
        self.log_path: str | None = None
        self.proc: subprocess.Popen | None = None

    def start(self) -> Job:
        cmd = resolve(self.cmd)
        if self.log:
            with tempfile.NamedTemporaryFile(prefix="commviz-job-", suffix=".log", delete=False) as f:
                self.log_path = f.name
                self.proc = subprocess.Popen(cmd, env=self.env, stdout=f, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
        else:
            self.proc = subprocess.Popen(cmd, env=self.env)
        return self

    def wait(self, timeout: float | None = None) -> int:
        assert self.proc is not None, "start() first"
        return self.proc.wait(timeout)

    def wait_or_diagnose(self, check: Callable[[], list], every_s: float = 0.5) -> tuple[int, list]:
        """Wait for the job, calling `check()` about every `every_s`; as soon as it
        returns findings, stop the job. Returns (exit status, the findings that
        stopped it, or [] if it ended by itself)."""
        while True:
            try:
                return self.wait(timeout=every_s), []
            except subprocess.TimeoutExpired:
                pass
            found = check()
            if found:
                return self.stop(), found

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM torchrun (it forwards to its workers), then SIGKILL if it lingers."""
        return self._end(self.proc.terminate if self.proc else None, grace_s)

    def interrupt(self, grace_s: float | None = 5.0) -> int | None:
        """Ctrl-C the job if it still runs (what a user at its terminal would do),
        SIGKILL if it lingers past `grace_s` (None: wait for it)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        return self._end(lambda: self.proc.send_signal(signal.SIGINT), grace_s)

    def _end(self, ask, grace_s: float | None) -> int:
        assert self.proc is not None, "start() first"
        if ask is not None:
            ask()
        try:
            return self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def torchrun(nproc: int, script: str, *args: str) -> list[str]:
    """A torchrun command line that uses this interpreter's torch."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", script, *args]

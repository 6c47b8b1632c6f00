import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs")


def _ops_of_this_torch() -> tuple[str, str]:
    """torch 2.13 added all_gather_single / reduce_scatter_single (FSDP2 calls them);
    older torch calls all_gather_into_tensor / reduce_scatter_tensor for the same."""
    try:
        import torch.distributed as dist
    except ImportError:
        return "all_gather_single", "reduce_scatter_single"
    return ("all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor",
            "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor")


AG_SINGLE, RS_SINGLE = _ops_of_this_torch()


def _dtensor_gather_of_this_torch() -> str:
    """DTensor's Shard→Replicate gathers with funcol.all_gather_single on torch 2.13 and
    with funcol.all_gather_tensor before it (the same bytes)."""
    try:
        import torch.distributed._functional_collectives as funcol
    except ImportError:
        return "funcol.all_gather_single"
    return "funcol.all_gather_single" if hasattr(funcol, "all_gather_single") else "funcol.all_gather_tensor"


DTENSOR_GATHER = _dtensor_gather_of_this_torch()


def torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]


def commviz(*args: str) -> list[str]:
    return [sys.executable, "-m", "commviz.cli", *args]


def run(cmd, env=None, timeout=120, cwd=REPO) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env or {})
    p = subprocess.run(cmd, env=full_env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
    return p


TORCH_EXIT_ABORT = "terminate called without an active exception"


def run_plain(cmd, env=None, timeout=120, cwd=REPO) -> subprocess.CompletedProcess:
    """A job's baseline, run without commviz: once more if torch itself aborted it at exit.

    Plain torch, with no commviz loaded, now and then aborts a gloo rank after its work
    is done and its report written: a gloo work released while the interpreter
    finalizes (pytorch/pytorch#190489). Full runs of the suite met it twice, in the
    Accelerate job and in jobs/invisible.py's DDP job; 66 plain runs of the latter by
    themselves never did. A test compares the run under commviz with this one, so only
    the baseline gets a second chance; the run under commviz gets none."""
    p = run(cmd, env=env, timeout=timeout, cwd=cwd)
    if p.returncode != 0 and TORCH_EXIT_ABORT in p.stderr:
        sys.stderr.write("the plain baseline aborted at exit inside torch; running it once more\n")
        p = run(cmd, env=env, timeout=timeout, cwd=cwd)
    return p


def ends_per_rank(tdir, world: int) -> list[int]:
    """Ops each rank has finished so far, from the trace files a job is writing."""
    from commviz.trace.file import read_trace

    n = [0] * world
    for f in tdir.glob("rank-*.cvz"):
        for b in read_trace(f).batches:
            n[b.rank] += sum(type(e).__name__ == "OpEnd" for e in b.events)
    return n


@pytest.fixture
def isolated_env(tmp_path, monkeypatch):
    """Keep ranks from talking to a watcher the developer may have running."""
    sock_dir = tmp_path / "sock"
    sock_dir.mkdir(mode=0o700)
    monkeypatch.setenv("COMMVIZ_ADDR", f"ipc://{sock_dir}/nobody.sock")
    monkeypatch.delenv("COMMVIZ_TRACE_DIR", raising=False)
    return tmp_path

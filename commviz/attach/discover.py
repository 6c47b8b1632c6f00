"""Finding the ranks of torch.distributed jobs already running on this machine, from
what every launcher leaves in a process's environment (`/proc/<pid>/environ`): no
change to the job, no privilege beyond reading one's own processes.

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RUN_ID and
MASTER_ADDR/PORT in each worker (not in its own agent process); Open MPI's mpiexec
sets OMPI_COMM_WORLD_RANK/SIZE, MPICH and Intel MPI PMI_RANK/PMI_SIZE, srun
SLURM_PROCID/SLURM_NTASKS. A Python process with one of those is a rank; ranks with
the same run id, MPI job or Slurm step (or, failing those, master address and
port) are one job. The environment also says which of torch's debugging aids the
job turned on: attach reports them, and how to turn on the rest next time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from commviz.launchers import RANK_VARS as _RANK_VARS
from commviz.launchers import Launcher, env_int


# What the job enabled, by the variable that enables it.
FLIGHT_RECORDER = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_FILE = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DUMP_PIPE = ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE",)
RAS_ADDR = "NCCL_RAS_ADDR"
KEPT = (*FLIGHT_RECORDER, *DUMP_FILE, *DUMP_PIPE, RAS_ADDR, "NCCL_RAS_ENABLE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "COMMVIZ", "COMMVIZ_ADDR", "COMMVIZ_TRACE_DIR", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankProc:
    """One rank of a job, as its process's environment says."""

    pid: int
    rank: int
    world_size: int
    local_rank: int
    launcher: Launcher
    job: str  # the key ranks of one job share
    cmdline: tuple[str, ...]
    env: dict = field(default_factory=dict, compare=False, hash=False)  # the KEPT variables it has

    def has(self, names) -> str:
        """The first of `names` set (non-empty) in its environment, "" if none."""
        return next((n for n in names if self.env.get(n)), "")


@dataclass
class Job:
    key: str
    ranks: list[RankProc]

    @property
    def world_size(self) -> int:
        return max((r.world_size for r in self.ranks), default=0)

    @property
    def launcher(self) -> Launcher:
        return self.ranks[0].launcher


def read_environ(pid: int, proc: str = "/proc") -> dict[str, str] | None:
    """A process's environment at its start, None where it is gone or not ours."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def read_cmdline(pid: int, proc: str = "/proc") -> tuple[str, ...]:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            return tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except OSError:
        return ()


_AGENTS = ("torch.distributed.run", "torchrun", "torch.distributed.launch")


def rank_of(pid: int, env: dict[str, str], cmdline: tuple[str, ...]) -> RankProc | None:
    """The rank this process is, None if it is no rank of a torch.distributed job
    (torchrun's own agent carries a launcher's variables too: under srun it has
    SLURM_PROCID and an exported MASTER_ADDR)."""
    if not cmdline or "python" not in os.path.basename(cmdline[0]).lower():
        return None
    if any(a in _AGENTS or os.path.basename(a) == "torchrun" for a in cmdline[1:4]):
        return None
    for launcher, rv, wv, lv in _RANK_VARS:
        rank, world = env_int(env.get(rv)), env_int(env.get(wv))
        if rank is None or world is None or not 0 <= rank < world:
            continue
        if launcher is Launcher.TORCHRUN and not env.get("TORCHELASTIC_RUN_ID"):
            launcher = Launcher.ENV
        if launcher is Launcher.SLURM and not env.get("MASTER_ADDR"):
            continue  # an srun task that is not a torch.distributed rank (no rendezvous)
        local = env_int(env.get(lv))
        return RankProc(pid, rank, world, local if local is not None else -1, launcher, job_key(launcher, env),
                        cmdline, {k: env[k] for k in KEPT if k in env})
    return None


def job_key(launcher: Launcher, env: dict[str, str]) -> str:
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"torchrun:{env['TORCHELASTIC_RUN_ID']}"
    if launcher is Launcher.OPENMPI and env.get("OMPI_MCA_ess_base_jobid"):
        return f"openmpi:{env['OMPI_MCA_ess_base_jobid']}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}"
    return f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"


def find_ranks(proc: str = "/proc", skip: set[int] | None = None) -> list[RankProc]:
    """Every rank on this machine we may read, by pid."""
    skip = skip if skip is not None else {os.getpid()}
    out = []
    try:
        pids = sorted(int(p) for p in os.listdir(proc) if p.isdigit())
    except OSError:
        return []
    for pid in pids:
        if pid in skip:
            continue
        env = read_environ(pid, proc)
        if not env:
            continue
        r = rank_of(pid, env, read_cmdline(pid, proc))
        if r is not None:
            out.append(r)
    parents = {parent_of(r.pid, proc) for r in out}
    return [r for r in out if r.pid not in parents]  # a launcher's process above the ranks is none


def parent_of(pid: int, proc: str = "/proc") -> int:
    try:
        with open(f"{proc}/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def started_at(pid: int, proc: str = "/proc") -> float | None:
    """When the process started (epoch seconds), from its stat and the boot time."""
    try:
        with open(f"{proc}/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open(f"{proc}/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def group_jobs(ranks: list[RankProc]) -> list[Job]:
    """Ranks by job, each job's ranks in rank order, jobs by their first pid."""
    by: dict[str, list[RankProc]] = {}
    for r in ranks:
        by.setdefault(r.job, []).append(r)
    jobs = [Job(k, sorted(v, key=lambda r: (r.rank, r.pid))) for k, v in by.items()]
    return sorted(jobs, key=lambda j: min(r.pid for r in j.ranks))

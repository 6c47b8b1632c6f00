"""What each launcher tells a rank through its environment, in one table: the
probe reads a rank's local rank from it (one sampler per host), `commviz attach`
finds ranks of jobs it did not start by it.

torchrun: RANK, WORLD_SIZE, LOCAL_RANK. Open MPI's mpiexec: OMPI_COMM_WORLD_RANK,
_SIZE, _LOCAL_RANK. MPICH / Intel MPI (Hydra): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID.
Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID.
"""

from __future__ import annotations

import os
from enum import Enum


class Launcher(str, Enum):
    TORCHRUN = "torchrun"
    OPENMPI = "openmpi"
    PMI = "pmi"
    SLURM = "slurm"
    ENV = "env"  # RANK/WORLD_SIZE set by hand or by another launcher


# (launcher, rank variable, world size variable, local rank variable), most specific first
RANK_VARS = (
    (Launcher.TORCHRUN, "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    (Launcher.OPENMPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    (Launcher.PMI, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    (Launcher.SLURM, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)


def env_int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None and v != "" else None
    except ValueError:
        return None


def local_rank(env=None) -> int | None:
    """This process's rank on its host, as the first launcher that set one says;
    None when none did."""
    env = os.environ if env is None else env
    for _, _, _, lv in RANK_VARS:
        v = env_int(env.get(lv))
        if v is not None:
            return v
    return None

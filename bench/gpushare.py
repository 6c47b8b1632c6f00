"""Several NCCL ranks on ONE GPU (issue 50): the environment each rank needs, in one
place, and a wrapper that sets it for any job.

NCCL refuses two ranks on one device ("Duplicate GPU detected", src/init.cc): it
compares each rank's host hash and bus id, and the host hash is `NCCL_HOSTID` where
that is set (src/misc/utils.cc). So each rank gets a host id of its own and every rank
the same GPU; with peer-to-peer, shared memory and InfiniBand off, NCCL can reach the
other "hosts" only through its socket transport, on the loopback interface. Whether
NCCL then works is what bench/nccl_share.py finds out; this module only says how.

Used by everything that runs several ranks on one GPU:
  - bench/nccl_share.py and bench/gpu_overlap.py import it (their directory, bench/,
    is on sys.path when they run as scripts) and set it before torch starts NCCL;
  - the jobs bench/nccl_world.py runs go through it as a wrapper:

        torchrun --nproc-per-node 2 bench/gpushare.py JOB.py ARGS...

    sets this rank's variables from LOCAL_RANK, then execs `python JOB.py ARGS...` in
    the same process (same pid: torchrun, commviz and attach see the rank they
    started; the job's own file is its `__main__`, so its lines are its own).

On a machine without CUDA (the `--dry-run` rehearsals, gloo) the variables do nothing.
"""

from __future__ import annotations

import os
import sys

HOSTID_PREFIX = "commviz-share-"


def shared_gpu(env=None) -> str:
    """The GPU every rank shares: the first of CUDA_VISIBLE_DEVICES as the job was
    started (an index or a UUID), else 0."""
    env = os.environ if env is None else env
    first = env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return first or "0"


def share_env(rank: int, gpu: str = "0") -> dict[str, str]:
    """The variables that let local rank `rank` share GPU `gpu` with the others."""
    return {
        "NCCL_HOSTID": f"{HOSTID_PREFIX}{rank}",  # a "host" of its own: no duplicate-GPU refusal
        "CUDA_VISIBLE_DEVICES": gpu,  # the same GPU for every rank: it is cuda:0 in each
        "NCCL_P2P_DISABLE": "1",  # no CUDA IPC / NVLink between "hosts" that are one GPU
        "NCCL_SHM_DISABLE": "1",  # no shared-memory transport
        "NCCL_IB_DISABLE": "1",  # not InfiniBand/RoCE where the machine has it: the socket transport
        "NCCL_SOCKET_IFNAME": "lo",  # over loopback, for the bootstrap and the data
    }


def local_rank(env=None) -> int:
    env = os.environ if env is None else env
    return int(env.get("LOCAL_RANK", env.get("RANK", "0")))


def apply(env=None) -> dict[str, str]:
    """Set this rank's share variables in `env` (os.environ): before torch touches CUDA
    or NCCL. Returns what was set."""
    env = os.environ if env is None else env
    add = share_env(local_rank(env), shared_gpu(env))
    env.update(add)
    return add


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(__doc__)
        raise SystemExit(2)
    apply()
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])

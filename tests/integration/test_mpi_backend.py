"""commviz on a process group that is neither gloo nor NCCL (issue 33): a Python
backend over mpi4py registered with `dist.Backend.register_backend`, launched by
MPICH's `mpiexec` rather than torchrun, recorded exactly, with each rank's local
rank from MPI's environment."""

import json
import os
import shutil

import pytest

from commviz.events import Hello
from commviz.trace.file import load
from tests.helpers import free_port
from tests.integration.conftest import JOBS, commviz, run

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec (pip install mpi4py mpich)")]
pytest.importorskip("mpi4py")



def test_a_custom_backend_under_mpiexec_is_recorded_exactly(isolated_env):
    out = isolated_env / "mpi.cvz"
    job = os.path.join(JOBS, "mpi_backend.py")
    p = run(commviz("record", "-o", str(out), "--", "mpiexec", "-n", "4", "python3", job, str(free_port())),
            timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "internal error" not in p.stderr, p.stderr
    s = json.loads(run(commviz("summary", str(out), "--json")).stdout)
    assert s["backend"] == "mpi4py" and s["world_size"] == 4
    for pr in s["per_rank"]:
        p2p = {"send": {"count": 1, "bytes": 1024}} if pr["rank"] % 2 == 0 else {"recv": {"count": 1, "bytes": 1024}}
        assert pr["ops"] == {"all_reduce": {"count": 10, "bytes": 10240}, "broadcast": {"count": 1, "bytes": 1024},
                             "all_gather": {"count": 1, "bytes": 4096}, "barrier": {"count": 1, "bytes": 0},
                             **p2p}, pr
    hellos = {e.rank: e for b in load(out).batches for e in b.events if isinstance(e, Hello)}
    assert {r: h.local_rank for r, h in hellos.items()} == {0: 0, 1: 1, 2: 2, 3: 3}

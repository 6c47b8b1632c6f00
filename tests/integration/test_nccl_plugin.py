"""NCCL's own view reaches the trace through the rank's one sender (issue 51): a job
under `commviz record` whose process drives commviz's NCCL profiler plugin as NCCL
would (tests/fake_nccl.py, on the library the probe named in NCCL_PROFILER_PLUGIN).
The real NCCL run waits for a GPU (bench/gpu_check.sh)."""

import json
import os

import pytest

from tests.integration.conftest import JOBS, commviz, run, torchrun

pytestmark = pytest.mark.native
JOB = os.path.join(JOBS, "nccl_plugin_job.py")


def test_what_nccl_runs_is_counted_exactly_per_rank_beside_the_probes_ops(tmp_path):
    out = tmp_path / "t.cvz"
    p = run(commviz("record", "-o", str(out), "--", *torchrun(2, JOB, "--ops", "50", "--replays", "20")),
            timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    s = run(commviz("summary", str(out), "--json"))
    assert s.returncode == 0, s.stderr
    rows = json.loads(s.stdout)["per_rank"]
    comm = f"{0xC0FFEE02:016x}"
    for rank, row in enumerate(rows):
        assert row["ops"]["all_reduce"]["count"] == 1  # the probe's own, beside NCCL's
        assert row["nccl"] == {comm: {"rank": rank, "nranks": 2, "nodes": 1, "ended": True, "ops": {
            "AllReduce": {"count": 50 + 20, "bytes": 70 * 4096, "device_ns": 50 * 150 + 20 * 20, "timed": 70,
                          "captured": 1, "replays": 20},
            "Send": {"count": 1, "bytes": 256, "device_ns": 10, "timed": 1},
        }}}

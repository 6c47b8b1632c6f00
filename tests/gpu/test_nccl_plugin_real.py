"""commviz's NCCL profiler plugin loaded by a real NCCL (issue 51), world size 1:
self sends and receives made through ctypes on torch's libnccl.so.2, which the probe
never sees, are counted exactly from NCCL's own reports. Skipped where there is no
CUDA device; `bench/gpu_check.sh` runs it on a GPU machine and keeps the trace as a
fixture (`$OUT/nccl_plugin.cvz`) for CPU tests to replay."""

import json
import os
import shutil

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here", allow_module_level=True)

from tests.integration.conftest import commviz, run, torchrun  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "nccl_plugin_self.py")


def test_self_sends_through_ctypes_are_counted_from_nccls_own_reports(tmp_path):
    out, expect = tmp_path / "plugin.cvz", tmp_path / "expect.json"
    p = run(commviz("record", "-o", str(out), "--", *torchrun(1, JOB, "--expect", str(expect))),
            env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}, timeout=240)
    keep = os.environ.get("OUT")
    if keep:
        shutil.copy(out, os.path.join(keep, "nccl_plugin.cvz"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "Successfully loaded external profiler plugin" in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]
    want = json.loads(expect.read_text())
    s = run(commviz("summary", str(out), "--json"))
    [row] = json.loads(s.stdout)["per_rank"]
    assert "nccl" in row, row
    counts = {f: t["count"] for comm in row["nccl"].values() for f, t in comm["ops"].items()}
    assert counts.get("Send") == want["Send"] and counts.get("Recv") == want["Recv"], row["nccl"]

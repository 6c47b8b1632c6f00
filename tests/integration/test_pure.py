"""COMMVIZ_PURE=1 (issue 32): a 4-rank job recorded exactly with no compiled part
of commviz loaded in any rank (each checks its sys.modules), and `doctor` under the
same environment saying all are off — the fallbacks every compiled part has, proven
end to end (CI runs this in its pure-Python leg too)."""

import json
import os

import pytest

from tests.integration.conftest import JOBS, commviz, run, torchrun

from commviz import native

# CI's pure leg runs it (COMMVIZ_PURE=1 python -m pytest tests/integration/test_pure.py, .ci/run):
# once is enough, and its subprocesses get COMMVIZ_PURE=1 either way
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not native.pure(), reason="run with COMMVIZ_PURE=1 (CI's pure-Python leg)")]


def test_a_pure_python_record_is_exact(isolated_env):
    env = {"COMMVIZ_PURE": "1"}
    doc = json.loads(run(commviz("doctor", "--json"), env=env).stdout)
    assert doc["pure"] and all(s.startswith("off") for s in doc["compiled"].values()), doc
    out = isolated_env / "t.cvz"
    p = run(commviz("record", "-o", str(out), "--", *torchrun(4, os.path.join(JOBS, "pure_check.py"))), env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads(run(commviz("summary", str(out), "--json"), env=env).stdout)
    want = {"all_reduce": {"count": 20, "bytes": 20 * 1024}, "broadcast": {"count": 1, "bytes": 1024},
            "barrier": {"count": 1, "bytes": 0}}
    for pr in s["per_rank"]:
        p2p = {"send": {"count": 1, "bytes": 1024}} if pr["rank"] % 2 == 0 else {"recv": {"count": 1, "bytes": 1024}}
        assert pr["ops"] == {**want, **p2p}, pr
    assert s["diagnoses"] == [] and all(r["status"] == "exited" for r in s["ranks"])

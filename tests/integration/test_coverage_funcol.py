"""What DDP's constructor, the functional collectives and DTensor send is seen with
exact bytes, and the audit against torch's flight recorder finds nothing unseen —
until a ProcessGroup method is called directly, which it counts."""

import json
import os

import pytest

from commviz.events import OpEnd, OpStart
from commviz.trace.file import load
from tests.integration.conftest import DTENSOR_GATHER, JOBS, commviz, run, torchrun

# one worker runs the module: its job (a module fixture) runs once under `pytest -n`
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("coverage_funcol")]
WORLD = 2


def record(tmp_path_factory, *args):
    d = tmp_path_factory.mktemp("funcol")
    sock = tmp_path_factory.mktemp("sock")
    os.chmod(sock, 0o700)
    p = run(torchrun(WORLD, "-m", "commviz.run", os.path.join(JOBS, "funcol_ddp.py"), *args),
            env={"COMMVIZ_TRACE_DIR": str(d), "COMMVIZ_ADDR": f"ipc://{sock}/nobody.sock",
                 "TORCH_FR_BUFFER_SIZE": "2000"})
    assert p.returncode == 0, p.stderr[-3000:]
    return d


def summary(d) -> dict:
    p = run(commviz("summary", str(d), "--json"))
    assert p.returncode == 0
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def covered(tmp_path_factory):
    return record(tmp_path_factory)


def events(d):
    starts, ends = {}, {}
    for b in load(d).batches:
        for e in b.events:
            if isinstance(e, OpStart):
                starts.setdefault(b.rank, []).append(e)
            elif isinstance(e, OpEnd):
                ends.setdefault(b.rank, {})[e.id] = e
    return starts, ends


def test_ddp_start_up_sync_and_parameter_check_with_exact_bytes(covered):
    starts, ends = events(covered)
    # Linear(10,20) 220 + BatchNorm1d(20) 40 params + 2×20 running stats + 1 int64 counter + Linear(20,3) 63
    state = (220 + 40 + 40 + 63) * 4 + 8
    params = [(20, 10), (20,), (20,), (20,), (3, 20), (3,)]
    verify = 8 * sum(2 * len(s) for s in params) * WORLD
    for r in range(WORLD):
        got = {s.op: s for s in starts[r] if s.op.startswith("_")}
        assert (got["_broadcast_coalesced"].bytes, got["_broadcast_coalesced"].root) == (state, 0)
        assert got["_verify_params_across_processes"].bytes == verify
        assert got["_verify_params_across_processes"].seq < got["_broadcast_coalesced"].seq
        assert all(ends[r][s.id].error == "" for s in got.values())


def test_functional_collectives_and_dtensor_with_exact_counts(covered):
    starts, ends = events(covered)
    for r in range(WORLD):
        fc = [(s.op, s.bytes) for s in starts[r] if s.op.startswith("funcol.")]
        assert sorted(fc) == sorted([
            ("funcol.all_reduce", 32), ("funcol.all_gather_tensor", 32 * WORLD),
            ("funcol.reduce_scatter_tensor", 32 * WORLD), ("funcol.all_to_all_single", 16 * WORLD),
            ("funcol.all_reduce", 32),  # the unused one
            (DTENSOR_GATHER, 4 * WORLD * 3 * 4),  # DTensor Shard(0) → Replicate
        ])
        assert [s.op for s in starts[r]].count("scatter") == 1  # distribute_tensor
        assert all(s.id in ends[r] for s in starts[r]), "every op ends"
    # the same (group, seq) on every rank names the same op
    seqs = [[(s.group, s.seq, s.op) for s in starts[r]] for r in range(WORLD)]
    assert seqs[0] == seqs[1]


def test_audit_finds_nothing_unseen_when_every_call_is_covered(covered):
    doc = summary(covered)
    for pr in doc["per_rank"]:
        a = pr["audit"]
        assert a["unseen"] == {} and a["seen"] == a["backend"], a
        assert a["backend"]["all_gather"] >= 3  # parameter check, all_gather_tensor, redistribute


def test_audit_counts_process_group_methods_called_directly(tmp_path_factory):
    d = record(tmp_path_factory, "--direct")
    for pr in summary(d)["per_rank"]:
        a = pr["audit"]
        assert a["unseen"] == {"all_reduce": 2, "broadcast": 1}
        assert all(a["seen"][k] + a["unseen"].get(k, 0) == n for k, n in a["backend"].items())
    p = run(commviz("summary", str(d)))
    assert "rank 0: unseen by commviz: 2 all_reduce, 1 broadcast" in p.stdout

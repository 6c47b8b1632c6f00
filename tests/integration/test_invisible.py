"""Under commviz a program sees the same torch.distributed as without it: the same
modules loaded, the same functions by every face (pickle, identity, inspect, help),
DDP models that save, load and deepcopy the same, the same numbers. torch's own test
suite failed on two of these (`torch.save(ddp_model)`); bench/peer_suite.py runs that
suite whole."""

import json
import os

import pytest

from commviz.events import OpEnd, OpStart
from commviz.launch import job_env
from commviz.trace.file import load
from tests.integration.conftest import JOBS, run, run_plain, torchrun

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    """(plainly, under commviz, the ops commviz recorded) of jobs/invisible.py."""
    tmp = tmp_path_factory.mktemp("invisible")
    sock = tmp / "sock"
    sock.mkdir(mode=0o700)
    job = os.path.join(JOBS, "invisible.py")
    plain_env = {k: v for k, v in os.environ.items() if not k.startswith("COMMVIZ")}
    got = []
    for name, env in (("plain", plain_env), ("commviz", job_env(f"ipc://{sock}/nobody.sock", plain_env))):
        if name == "commviz":
            env["COMMVIZ_TRACE_DIR"] = str(tmp / "trace")
        out = tmp / f"{name}.json"
        p = (run_plain if name == "plain" else run)(torchrun(3, job, "--out", str(out)), env=env, timeout=240)
        assert p.returncode == 0, f"the job run {name}: " + p.stderr[-3000:]
        got.append(json.loads(out.read_text()))
    ops = [e.op for b in load(tmp / "trace").batches for e in b.events if isinstance(e, OpStart)]
    return got[0], got[1], ops


def test_commviz_watched_the_job(seen):
    _, _, ops = seen
    assert ops.count("ddp_bucket") >= 3 * 3 and ops.count("barrier") >= 3  # it was on, and saw the buckets


def test_no_torch_module_is_imported_on_the_programs_behalf(seen):
    plain, under, _ = seen
    for key in ("torch_modules_collectives", "torch_modules"):  # after collectives, then after DDP
        assert set(under[key]) - set(plain[key]) == set(), key
    assert under["functional_collectives_attribute"] is plain["functional_collectives_attribute"] is False


def test_a_ddp_model_keeps_nothing_of_commviz_and_saves_loads_and_copies(seen):
    plain, under, _ = seen
    for key in ("ddp_attributes", "deepcopy_attributes", "ddp_comm_hooks", "ddp_logging_comm_hook",
                "hooked_logging_comm_hook", "losses", "weights_sha256", "hooked_losses", "loaded_trains",
                "deepcopy_trains", "hooked_copy_trains"):
        assert under[key] == plain[key], key
    assert under["hook_is_torchs"] and under["hooked_pickle"]


def test_torchs_functions_look_the_same_every_way(seen):
    plain, under, _ = seen
    assert under["same_objects"] == plain["same_objects"] == [True, True]
    assert under["optimizer_hooks_pickle"] == plain["optimizer_hooks_pickle"]
    assert under["builtins"] == plain["builtins"]
    for name, face in plain["faces"].items():
        for k, v in face.items():
            assert under["faces"][name][k] == v, f"{name}: {k}"


def test_a_job_that_exits_with_ops_in_flight_exits_cleanly_and_every_op_ends(tmp_path):
    sock = tmp_path / "sock"
    sock.mkdir(mode=0o700)
    env = job_env(f"ipc://{sock}/nobody.sock", {})
    env["COMMVIZ_TRACE_DIR"] = str(tmp_path / "trace")
    p = run(torchrun(3, os.path.join(JOBS, "exit_in_flight.py")), env=env, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "terminate called" not in p.stderr
    events = [(b.rank, e) for b in load(tmp_path / "trace").batches for e in b.events]
    starts = {(r, e.id) for r, e in events if isinstance(e, OpStart) and e.op in ("all_reduce", "isend", "irecv")}
    assert len(starts) == 3 * (100 + 20 + 20)
    ended = {(r, e.id) for r, e in events if isinstance(e, OpEnd)}
    assert starts <= ended

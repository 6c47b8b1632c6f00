"""The NCCL path on a real GPU (issues 15 and 17): every op family on NCCL, world size
1, under `commviz record`. Skipped where there is no CUDA device; `bench/gpu_check.sh`
runs it on a GPU machine."""

import json
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device here", allow_module_level=True)

from commviz.events import Hello, HostTopology, OpEnd, OpStart  # noqa: E402
from commviz.trace.file import load  # noqa: E402
from tests.integration.conftest import commviz, run, torchrun  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobs", "every_op_nccl.py")
# Ops the probe sees with a CUDA tensor in hand: device-timed (or captured).
HOST_TIMED = {"barrier", "broadcast_object_list"}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu")
    out, expect = d / "nccl.cvz", d / "expected.json"
    p = run(commviz("record", "-o", str(out), "--", *torchrun(1, JOB, "--expect", str(expect))), timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p, out, expect


@pytest.fixture(scope="module")
def job(ran):
    p, out, expect = ran
    s = run(commviz("summary", str(out), "--json"))
    assert s.returncode == 0, s.stderr
    events = [e for b in load(out).batches for e in b.events]
    return json.loads(expect.read_text()), json.loads(s.stdout), events


def test_counts_and_bytes_are_exact_for_every_op_family(job):
    expected, summary, _ = job
    [pr] = summary["per_rank"]
    got = {op: {"count": v["count"], "bytes": v["bytes"]} for op, v in pr["ops"].items()}
    assert got == expected["ops"], expected.get("notes")


def test_every_cuda_op_is_timed_on_the_device(job):
    _, _, events = job
    starts = {e.id: e for e in events if isinstance(e, OpStart)}
    ends = {e.id: e for e in events if isinstance(e, OpEnd)}
    assert set(ends) == set(starts)
    p2p_refused = "p2p" in job[0]["notes"]  # torch refused a batch sending to self: failed events
    for i, s in starts.items():
        e = ends[i]
        if p2p_refused and s.op in ("isend", "irecv"):
            assert e.error
            continue
        assert not e.error, (s.op, e.error)
        if s.op in HOST_TIMED or e.captured:
            continue
        assert e.device_ns >= 0 and e.enqueue_ns >= 0, (s.op, e)
        assert e.device_ns <= e.t - s.t + 1_000_000, (s.op, e)  # seen done after it was done (1 ms clock slack)


def test_device_time_is_the_ops_own_not_the_queue_in_front_of_it(job):
    """An all_reduce issued behind ~0.1 s of matmuls: seen done only after them (host
    time includes them), yet its device time is its own. Host timing, or events that
    both sit after the op, cannot pass this."""
    expected, _, events = job
    q = expected["queued"]
    ends = {e.id: e for e in events if isinstance(e, OpEnd)}
    [s] = [e for e in events if isinstance(e, OpStart) and e.op == "all_reduce" and e.bytes == 4 * q["floats"]]
    e = ends[s.id]
    host_ns, behind_ns = e.t - s.t, q["behind_ms"] * 1e6
    assert behind_ns > 20e6, q  # the matmuls really queued the op (a faster GPU: more of them)
    assert host_ns >= 0.8 * behind_ns, (host_ns, q)
    assert 0 <= e.device_ns < 0.2 * behind_ns, (e.device_ns, q)


def test_the_first_op_on_the_communicator_says_so_and_only_it(job):
    _, _, events = job
    starts = {e.id: e for e in events if isinstance(e, OpStart)}
    firsts = [starts[e.id] for e in events if isinstance(e, OpEnd) and e.first]
    by_comm = {}
    for s in firsts:
        key = (s.group, s.peer if s.op in ("send", "recv", "isend", "irecv") else -1)
        assert key not in by_comm, (s, by_comm)
        by_comm[key] = s
    assert by_comm, "no op was marked first on its communicator"


def test_the_captured_collective_is_marked_captured(job):
    expected, _, events = job
    if expected["graph"] != "captured":
        pytest.skip(f"the CUDA graph capture itself failed: {expected['graph']}")
    assert sum(1 for e in events if isinstance(e, OpEnd) and e.captured) == 1


def test_the_probes_queries_leave_another_librarys_global_capture_valid(job):
    """The probe's CUDA thread runs in thread-local capture mode (the driver's
    cuThreadExchangeStreamCaptureMode): its polls during a raw global-mode capture on
    another thread must not invalidate it."""
    expected, _, _ = job
    assert expected["capture_mode"] == "thread_local"
    if expected["raw_capture"].startswith("not tried"):
        pytest.skip(expected["raw_capture"])
    assert expected["raw_capture"] == "valid"


def test_the_probe_never_synchronizes_the_device(job):
    expected, _, _ = job
    ours = [w for w in expected["sync_warnings"] if os.sep + "commviz" + os.sep in w["file"]]
    assert ours == [], ours


def test_the_probe_makes_torch_print_nothing_in_the_job(ran):
    """Work.exception() prints torch's deprecation warning at its first call; the
    probe asks a Work's result future instead (async ops are in the job)."""
    p, _, _ = ran
    assert "Work::exception API is being deprecated" not in p.stdout + p.stderr


def test_the_rank_names_its_gpu_without_set_device(job):
    expected, summary, events = job
    hello = [e for e in events if isinstance(e, Hello)][-1]
    assert hello.device == expected["device"] and hello.cuda_uuid == expected["uuid"]
    assert summary["ranks"][0]["device"] == expected["device"]


def test_local_rank_0_sends_its_hosts_topology_when_nvml_is_there(job):
    from commviz.topo.backend import open_backend

    b = open_backend()
    try:
        if not b.available:
            pytest.skip(f"no NVML here: {b.reason}")
    finally:
        b.close()
    _, _, events = job
    topo = [e for e in events if isinstance(e, HostTopology)]
    assert topo and topo[0].document["gpus"]

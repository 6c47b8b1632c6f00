"""DDP buckets and FSDP1/FSDP2 collectives, checked against what torch itself reports."""

import json
import os

import pytest

from commviz.events import OpEnd, OpStart
from commviz.trace.file import load
from tests.integration.conftest import AG_SINGLE, RS_SINGLE, JOBS, commviz, run, torchrun

pytestmark = pytest.mark.integration


def traced(tmp_path, job, *args):
    d = tmp_path / "trace"
    sock = tmp_path / "sock"
    sock.mkdir(mode=0o700)
    report = tmp_path / "report.json"
    p = run(
        torchrun(2, "-m", "commviz.run", os.path.join(JOBS, job), "--report", str(report), *args),
        env={"COMMVIZ_TRACE_DIR": str(d), "COMMVIZ_ADDR": f"ipc://{sock}/nobody.sock"},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads(run(commviz("summary", str(d), "--json", "--hang-after", "0.5")).stdout)
    assert s["diagnoses"] == []  # a healthy training step: nothing to report
    events = {}
    for b in load(d).batches:
        for e in b.events:
            if isinstance(e, (OpStart, OpEnd)):
                events.setdefault(b.rank, []).append(e)
    return events, json.loads(report.read_text())


def pairs(evs):
    ends = {e.id: e for e in evs if isinstance(e, OpEnd)}
    return [(s, ends.get(s.id)) for s in evs if isinstance(s, OpStart)]


@pytest.mark.parametrize("hook", ["none", "before", "after"])
def test_ddp_buckets_match_torch(tmp_path, hook):
    """Two iterations: DDP reduces one bucket first, then rebuilds into two, and
    the rebuild's own broadcasts are seen."""
    events, rep = traced(tmp_path, "ddp_train.py", "--hook", hook)
    first = [int(x) for x in rep["logging"]["bucket_sizes"].split(",")]
    rebuilt = rep["rebuilt_bucket_bytes"]
    assert sum(first) == sum(rep["params"]) and len(rebuilt) == 2
    # DDP's constructor: the shape check (2 int64 per dimension per parameter, all-gathered)
    # and the broadcast of rank 0's initial weights (every parameter, no buffers here)
    dims = 2 * (2 + 1)  # per Linear: weight (2 dims) + bias (1)
    start_up = [("_verify_params_across_processes", 0, 8 * 2 * dims * 2, -1, ""),
                ("_broadcast_coalesced", 1, sum(rep["params"]), -1, "")]
    for r in (0, 1):
        got = [(s.op, s.seq, s.bytes, s.bucket, e.error) for s, e in pairs(events[r])]
        assert got[:2] == start_up
        n = len(first)
        # the second forward rebuilds the buckets: the reducer broadcasts, from C++,
        # the new layout (every parameter's index and the bucket count, then each
        # bucket's size, as int32) from rank 0
        rebuild = got[2 + n:4 + n]
        assert rebuild == [("ddp_rebuild_broadcast", 2 + n, 4 * (len(rep["params"]) + 1), -1, ""),
                           ("ddp_rebuild_broadcast", 3 + n, 4 * len(rebuilt), -1, "")]
        assert all(s.root == 0 for s, _ in pairs(events[r])[2 + n:4 + n])
        buckets = got[2:2 + n] + got[4 + n:-1]
        assert [b[0] for b in buckets] == ["ddp_bucket"] * (n + 2)
        assert sorted(b[2] for b in buckets[n:]) == sorted(rebuilt)
        assert [b[2] for b in buckets[:n]] == first
        assert [b[3] for b in buckets] == [0] * n + [0, 1]
        # one seq each, no inner all_reduce
        assert [b[1] for b in buckets] == list(range(2, 2 + n)) + list(range(4 + n, 6 + n))
        assert all(b[4] == "" for b in buckets)
        # the job's own all_reduce afterwards is an ordinary event
        assert got[-1][0] == "all_reduce" and got[-1][1] == 4 + len(buckets)
        params = [s.params for s, _ in pairs(events[r])]
        assert params[2:2 + n] + params[4 + n:-1] == [4, 2, 2]
    if hook != "none":
        assert rep["hook_calls"] == [0, 0, 1]  # the user's hook still ran, once per bucket
        assert rep["logging"]["comm_hook"] == "my_hook"


def test_fsdp2_one_step(tmp_path):
    events, rep = traced(tmp_path, "fsdp_train.py")
    l1, l2 = (sum(x) for x in rep["layer_param_bytes"])
    for r in (0, 1):
        got = [(s.op, s.seq, s.bytes) for s, e in pairs(events[r])]
        # forward gathers layer 1 then 2; backward re-gathers 2 then 1 and reduce-scatters 2 then 1
        assert got == [
            (AG_SINGLE, 0, l1),
            (AG_SINGLE, 1, l2),
            (AG_SINGLE, 2, l2),
            (AG_SINGLE, 3, l1),
            (RS_SINGLE, 4, l2),
            (RS_SINGLE, 5, l1),
        ]
        assert all(e is not None and e.error == "" for _, e in pairs(events[r]))


def test_fsdp1_one_step(tmp_path):
    """FullyShardedDataParallel, each Linear its own unit: the same pattern through
    the ops FSDP1 calls, each flat parameter's unsharded bytes (both sizes are even:
    no padding on 2 ranks)."""
    events, rep = traced(tmp_path, "fsdp_train.py", "--fsdp1")
    l1, l2 = (sum(x) for x in rep["layer_param_bytes"])
    assert (l1, l2) == ((64 * 32 + 32) * 4, (32 * 16 + 16) * 4)
    for r in (0, 1):
        got = [(s.op, s.seq, s.bytes) for s, e in pairs(events[r])]
        assert got == [
            ("all_gather", 0, l1),
            ("all_gather", 1, l2),
            ("all_gather", 2, l2),
            ("all_gather", 3, l1),
            (RS_SINGLE, 4, l2),
            (RS_SINGLE, 5, l1),
        ]
        assert all(e is not None and e.error == "" for _, e in pairs(events[r]))

"""bench/nccl_world.py: the judgements its GPU checks pass, on recordings made up
here, its clean-up of a job's process tree, and one check rehearsed whole on gloo."""

import json
import os
import subprocess
import sys

import pytest

from commviz.events import OpEnd, OpStart
from tests.helpers import wait_for
from tests.integration.conftest import REPO

sys.path.insert(0, os.path.join(REPO, "bench"))

import nccl_world  # noqa: E402

MS = 1_000_000
EXP = {"big_bytes": 64 << 20, "small_bytes": 49380, "alone_bytes": (64 << 20) + 4}


def pair(second_device_ns: int, second_start: int = 50_000):
    """Rank 0's three all_reduces: alone (synchronized), then the big and the small
    async one, the small issued 50 µs after the big, seen done 1 ms after it."""
    return [
        OpStart(1, 0, "all_reduce", "0", 1, EXP["alone_bytes"]), OpEnd(1, 80 * MS, device_ns=78 * MS),
        OpStart(2, 100 * MS, "all_reduce", "0", 2, EXP["big_bytes"], is_async=True),
        OpStart(3, 100 * MS + second_start, "all_reduce", "0", 3, EXP["small_bytes"], is_async=True),
        OpEnd(2, 180 * MS, device_ns=79 * MS), OpEnd(3, 181 * MS, device_ns=second_device_ns),
    ]


def rec(events=None, summary=None, out=""):
    return nccl_world.Recorded(0, out, "", False, 1.0, "t.cvz", summary, events or {})


def judged(fn, *args):
    v = nccl_world.Verdict("x", 1, False)
    fn(v, *args)
    return v.doc


def test_a_queued_op_timed_on_its_own_passes():
    doc = judged(nccl_world.judge_queued, 1, rec({0: pair(300_000)}), EXP, False)
    assert doc["ok"], doc["failed"]
    assert doc["facts"]["per_rank"][0]["second"] == {"host_ms": 80.95, "device_ms": 0.3}


def test_a_queued_op_whose_device_time_holds_the_first_fails():
    doc = judged(nccl_world.judge_queued, 1, rec({0: pair(80 * MS)}), EXP, False)
    assert not doc["ok"] and any("includes the first's" in f for f in doc["failed"])


def test_a_second_op_issued_after_the_first_ended_is_no_queue():
    doc = judged(nccl_world.judge_queued, 1, rec({0: pair(300_000, second_start=90 * MS)}), EXP, False)
    assert not doc["ok"] and any("issued after the first" in f for f in doc["failed"])


def test_a_missing_rank_fails_and_a_dry_run_skips_device_times():
    doc = judged(nccl_world.judge_queued, 2, rec({0: pair(80 * MS)}), EXP, True)
    assert doc["failed"] == ["rank 1: the three all_reduces are not all there and ended: []"]
    assert doc["skipped"] == ["device times of the pair: gloo has none"]


HANG_EXP = {"kind": "hang", "file": "fault_nccl.py", "op": "all_reduce", "seq": 2, "default_group": False,
            "waiting": [0], "missing": [1], "culprit": [1], "instead": "barrier", "wait_lines": [75, 61],
            "culprit_line": 77}


def hang_summary(culprit_where="fault_nccl.py:77", seq=2):
    return {"ranks": [], "diagnoses": [{
        "kind": "hang", "op": "all_reduce", "group": "1", "seq": seq, "waiting_ranks": [0], "missing_ranks": [1],
        "culprit_ranks": [1], "message": "rank 1 never entered it — it is in barrier #0 on group 0",
        "stacks": [{"rank": 0, "where": "fault_nccl.py:61"}, {"rank": 1, "where": culprit_where}]}]}


def test_a_hang_read_as_the_job_said_passes():
    doc = judged(nccl_world.judge_fault, 2, rec(summary=hang_summary(), out="HANG: all_reduce #2"), HANG_EXP, "hang")
    assert doc["ok"], doc["failed"]


@pytest.mark.parametrize("summary,out,says", [
    (hang_summary(culprit_where="fault_nccl.py:75"), "HANG: x", "culprit rank 1 at 'fault_nccl.py:75'"),
    (hang_summary(seq=3), "HANG: x", "op/seq all_reduce #3, not all_reduce #2"),
    (hang_summary(), "", "record printed no diagnosis live"),
])
def test_a_hang_read_otherwise_fails_and_says_how(summary, out, says):
    doc = judged(nccl_world.judge_fault, 2, rec(summary=summary, out=out), HANG_EXP, "hang")
    assert not doc["ok"] and any(says in f for f in doc["failed"]), doc["failed"]


def mirrored(cycle_seq=2):
    """Two ranks, each waiting for the other: commviz reports the cycle from the
    barrier's side, the hang asked for is the cycle's other member."""
    s = hang_summary()
    s["diagnoses"][0].update(op="barrier", group="0", seq=0, waiting_ranks=[1], missing_ranks=[0], culprit_ranks=[0],
                             details={"cycle": [
                                 {"op": "all_reduce", "group": "1", "seq": cycle_seq, "waiting_ranks": [0],
                                  "missing_ranks": [1]},
                                 {"op": "barrier", "group": "0", "seq": 0, "waiting_ranks": [1], "missing_ranks": [0]}]})
    return s


def test_a_hang_reported_from_the_other_side_of_its_cycle_passes_only_if_the_cycle_holds_it():
    doc = judged(nccl_world.judge_fault, 2, rec(summary=mirrored(), out="HANG: x"), HANG_EXP, "hang")
    assert doc["ok"], doc["failed"]
    assert doc["facts"]["reported_from"] == "the other side of a cycle: barrier #0"
    doc = judged(nccl_world.judge_fault, 2, rec(summary=mirrored(cycle_seq=3), out="HANG: x"), HANG_EXP, "hang")
    assert not doc["ok"] and "op/seq barrier #0, not all_reduce #2" in doc["failed"]


def test_why_quotes_the_ranks_exception():
    text = "noise\n[rank1]: Traceback\n[rank1]: ValueError: bad dtype\nChildFailedError\n"
    assert nccl_world.why(text) == "[rank1]: ValueError: bad dtype"


def test_kill_tree_reaches_children_in_sessions_of_their_own():
    code = ("import subprocess, sys, time; [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
            "start_new_session=True) for _ in range(2)]; time.sleep(300)")
    p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    wait_for(lambda: len(nccl_world.descendants(p.pid)) >= 2, timeout=30)
    kids = nccl_world.descendants(p.pid)
    assert len(kids) == 2
    nccl_world.kill_tree(p.pid)
    p.wait(10)
    assert not any(nccl_world._alive(k) for k in kids)


@pytest.mark.integration
def test_the_hang_check_passes_on_gloo(tmp_path):
    """The whole chain the GPU runs: the job through the share wrapper under
    `commviz record`, the job's own expected diagnosis and lines, the judgement."""
    p = subprocess.run([sys.executable, os.path.join(REPO, "bench", "nccl_world.py"), "hang", "--world", "2",
                        "--dry-run", "--timeout", "90", "--fixtures", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    assert p.returncode == 0 and doc["ok"], doc["failed"]
    with open(os.path.join(REPO, "tests", "gpu", "jobs", "fault_nccl.py")) as f:
        barrier = next(i + 1 for i, line in enumerate(f) if line.rstrip().endswith("# @hang-culprit"))
    assert doc["facts"]["where"]["1"] == f"fault_nccl.py:{barrier}"  # the victim, in the barrier instead
    assert (tmp_path / "hang_ws2_summary.json").exists()

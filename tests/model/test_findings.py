"""Diagnoses from synthetic event streams: each kind names exactly the right ranks, op,
group and seq, says what the missing rank does instead and where (the user's line),
and a healthy job — jitter and all — produces none."""

from __future__ import annotations

import json
import random

import pytest

from commviz.events import Frame, Goodbye, GroupDef, OpEnd, OpStart, Stack
from commviz.model import Model, Thresholds
from commviz.model.stacks import INTERNAL, LIBRARY, USER, frame_rank, user_frame_index
from tests.helpers import WALL0, hello

S = 1_000_000_000
MS = 1_000_000
US = 1_000

DESIGN_KEYS = {"kind", "group", "seq", "op", "waiting_ranks", "missing_ranks", "culprit_ranks", "message"}


class Job:
    """A job fed event by event; times are seconds since the job's start."""

    def __init__(self, world: int, groups: dict[str, list[int]] | None = None, **th) -> None:
        self.m = Model(thresholds=Thresholds(**th)) if th else Model()
        self.world = world
        self.ids = [0] * world
        self.open: dict[tuple[int, str, int], int] = {}
        for r in range(world):
            self.m.ingest(r, hello(r, world=world))
        for gid, ranks in (groups or {"0": list(range(world))}).items():
            for r in ranks:
                if r < world:  # ranks beyond `world` never connect
                    self.m.ingest(r, GroupDef(gid, list(ranks), "gloo"))

    def start(self, rank: int, t: float, op: str = "all_reduce", group: str = "0", seq: int = 0,
              nbytes: int = 4096, dtype: str = "float32", **kw) -> int:
        op_id = self.ids[rank]
        self.ids[rank] += 1
        shape = kw.pop("shape", [nbytes // 4])
        self.m.ingest(rank, OpStart(op_id, int(t * S), op, group, seq, nbytes, dtype, shape, **kw))
        return op_id

    def end(self, rank: int, op_id: int, t: float, error: str = "") -> None:
        self.m.ingest(rank, OpEnd(op_id, int(t * S), error=error))

    def op(self, rank: int, t0: float, t1: float, **kw) -> None:
        self.end(rank, self.start(rank, t0, **kw), t1)

    def stack(self, rank: int, op_id: int, t: float, frames: list[Frame], **kw) -> None:
        self.m.ingest(rank, Stack(int(t * S), op_id, "MainThread", frames, **kw))

    def diagnoses(self, t: float) -> list[dict]:
        return self.m.diagnoses(WALL0 + int(t * S))

    def status(self, t: float) -> dict[int, str]:
        return {r["rank"]: r["status"] for r in self.m.summary(WALL0 + int(t * S))["ranks"]}


def torch_stack(user_line: int, user_file: str = "/home/me/proj/train.py") -> list[Frame]:
    """What the probe would capture in a rank blocked in a collective: runpy, the
    user's main and step, then torch's wrappers (outermost first)."""
    return [
        Frame("<frozen runpy>", 88, "_run_code"),
        Frame(user_file, 120, "main", "step(model, batch)"),
        Frame(user_file, user_line, "step", "dist.all_reduce(t)"),
        Frame("/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 81, "wrapper"),
        Frame("/work/commviz/commviz/probe/patch.py", 120, "wrapper"),
        Frame("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2501, "all_reduce"),
    ]


def only(diags: list[dict], kind: str) -> dict:
    found = [d for d in diags if d["kind"] == kind]
    assert len(found) == 1, [d["message"] for d in diags]
    return found[0]


def warm_up(j: Job, groups: list[str], n: int, t0: float = 0.0) -> float:
    """n healthy instances on each group, every rank in every group; returns the time after."""
    t = t0
    for gid in groups:
        ranks = j.m.groups[gid].ranks
        for seq in range(n):
            for k, r in enumerate(ranks):
                j.op(r, t + k * 1e-4, t + 0.001, group=gid, seq=seq)
            t += 0.002
    return t


# ---------------------------------------------------------------------- hang


def test_hang_names_waiting_and_missing_ranks_and_what_the_missing_rank_does():
    j = Job(4, {"0": [0, 1, 2, 3], "1": [0, 1, 2, 3]})
    warm_up(j, ["0", "1"], 7)
    ids = {r: j.start(r, 100.0, group="1", seq=7) for r in (0, 1, 3)}
    b = j.start(2, 100.2, op="broadcast", group="0", seq=7, root=0)  # rank 2 skipped all_reduce #7
    for r, op_id in ids.items():
        j.stack(r, op_id, 110.0, torch_stack(95))
    j.stack(2, b, 110.2, torch_stack(88))

    assert j.diagnoses(105.0) == []  # not yet past the 10 s threshold
    assert j.status(105.0) == {0: "waiting", 1: "waiting", 2: "waiting", 3: "waiting"}

    d = only(j.diagnoses(112.3), "hang")
    assert len(j.diagnoses(112.3)) == 1  # rank 2's broadcast is the same problem, not a second one
    assert (d["op"], d["group"], d["seq"]) == ("all_reduce", "1", 7)
    assert (d["waiting_ranks"], d["missing_ranks"], d["culprit_ranks"]) == ([0, 1, 3], [2], [2])
    assert d["message"].startswith("all_reduce #7 on group 1 (ranks 0-3): ranks 0,1,3 waiting 12.3 s at train.py:95;")
    assert "rank 2 never entered it — it is in broadcast #7 on group 0 for 12.1 s (train.py:88)" in d["message"]
    assert "ranks 0,1,3 in turn never entered broadcast #7 on group 0" in d["message"]
    assert d["details"]["missing"][0] == {
        "rank": 2, "state": "in_op", "op": "broadcast", "group": "0", "seq": 7, "peer": -1, "op_id": b,
        "for_s": 12.1, "where": "train.py:88",
    }
    stacks = {s["rank"]: s for s in d["stacks"]}
    assert sorted(stacks) == [0, 1, 2, 3]
    assert stacks[2]["user_frame"] == {"file": "/home/me/proj/train.py", "line": 88, "function": "step",
                                       "text": "dist.all_reduce(t)"}
    assert stacks[2]["frames"][0]["function"] == "all_reduce"  # innermost first, flagged
    assert [f["user"] for f in stacks[2]["frames"]] == [False, False, False, True, False, False]
    assert j.status(112.3) == {0: "hung", 1: "hung", 2: "hung", 3: "hung"}


def test_hang_minority_in_a_subgroup_is_the_culprit_even_on_a_tie_of_waiters():
    # Sub-group 1 = {0,1,2}; rank 2 skips its all_reduce and goes on to the world
    # barrier, where rank 3 (not in group 1) already waits: 2 waiters on each side.
    j = Job(4, {"0": [0, 1, 2, 3], "1": [0, 1, 2]})
    a = {r: j.start(r, 10.0, group="1", seq=0) for r in (0, 1)}
    j.start(2, 10.0, op="barrier", group="0", seq=0, nbytes=0, dtype="", shape=[])
    j.start(3, 9.0, op="barrier", group="0", seq=0, nbytes=0, dtype="", shape=[])
    assert a
    [d] = j.diagnoses(25.0)
    assert (d["kind"], d["op"], d["group"], d["seq"]) == ("hang", "all_reduce", "1", 0)
    assert (d["waiting_ranks"], d["missing_ranks"], d["culprit_ranks"]) == ([0, 1], [2], [2])
    assert "rank 2 never entered it — it is in barrier #0 on group 0 for 15.0 s" in d["message"]


def test_hang_across_groups_on_a_tie_reports_the_wait_that_began_first():
    # Sub-group 1 = {0,1}: rank 1 skips its all_reduce and joins the world all_reduce
    # with ranks 2,3. One rank on each side: the sub-group wait began first.
    j = Job(4, {"0": [0, 1, 2, 3], "1": [0, 1]})
    j.start(0, 10.0, group="1", seq=0)
    for r in (1, 2, 3):
        j.start(r, 10.0 + 0.001 * r, group="0", seq=0)
    [d] = j.diagnoses(25.0)
    assert (d["kind"], d["group"], d["seq"]) == ("hang", "1", 0)
    assert (d["waiting_ranks"], d["missing_ranks"], d["culprit_ranks"]) == ([0], [1], [1])
    assert "rank 0 in turn never entered all_reduce #0 on group 0, where ranks 1-3 wait" in d["message"]
    assert "either side may be the one out of order" in d["message"]


def test_instances_complete_when_their_group_arrives_late():
    m = Model()
    for r in (0, 1):
        m.ingest(r, hello(r))
        m.ingest(r, OpStart(0, 100, "all_reduce", "7", 0, 64))
        m.ingest(r, OpEnd(0, 200))
    assert len(m.pending) == 1
    m.ingest(0, GroupDef("7", [0, 1], "gloo"))
    assert m.pending == {} and m.summary()["ops"][0]["count"] == 1


def test_hang_missing_rank_idle_says_its_last_op():
    j = Job(2)
    j.op(0, 1.0, 1.5, seq=0)
    j.op(1, 1.2, 1.5, seq=0)
    j.start(0, 2.0, seq=1)
    [d] = j.diagnoses(14.0)
    assert (d["kind"], d["waiting_ranks"], d["missing_ranks"], d["culprit_ranks"]) == ("hang", [0], [1], [1])
    assert (d["op"], d["group"], d["seq"]) == ("all_reduce", "0", 1)
    assert "rank 1 never entered it — no op in flight — last op all_reduce #0 on group 0 ended 12.5 s ago" in d["message"]
    assert j.status(14.0) == {0: "hung", 1: "ok"}


def test_hang_missing_rank_silent_and_never_connected():
    j = Job(2, {"0": [0, 1, 2]})  # rank 2 of the group never says hello
    j.m.ingest(1, OpStart(0, 1 * S, "all_reduce", "0", 0, 64))
    j.m.ingest(0, OpStart(0, 1 * S, "all_reduce", "0", 0, 64))
    [d] = j.diagnoses(20.0)
    assert d["missing_ranks"] == [2]
    assert "rank 2 never entered it — no events from it at all (never connected to the watcher?)" in d["message"]
    # a rank that is connected but silent is flagged as such
    j2 = Job(2)
    j2.start(0, 1.0)
    assert "rank 1 never entered it — no op in flight, and no op yet; no events from it for 20.0 s" in j2.diagnoses(20.0)[0]["message"]


def test_hang_with_many_missing_ranks_stays_one_line_and_flags_lost_records():
    j = Job(8)
    for r in (0, 1):
        j.start(r, 1.0, seq=0)
    [d] = j.diagnoses(12.0)
    assert d["missing_ranks"] == [2, 3, 4, 5, 6, 7] and d["waiting_ranks"] == [0, 1]
    assert d["message"].count("never entered it") == 4
    assert d["message"].endswith("; ranks 6,7 are missing too (see details)")
    assert len(d["details"]["missing"]) == 6
    j2 = Job(2)
    j2.op(1, 0.5, 0.6, seq=1)  # rank 1's record of #0 never arrived; it is past it
    j2.start(0, 1.0, seq=0)
    assert "its record of #0 was lost" in j2.diagnoses(12.0)[0]["message"]


def test_hang_threshold_is_a_parameter():
    j = Job(2, hang_after_s=0.5)
    j.start(0, 1.0)
    assert j.diagnoses(1.4) == []
    assert j.diagnoses(1.6)[0]["kind"] == "hang"


# ------------------------------------------------------------------ dead rank


def test_dead_rank_live_after_the_grace_period():
    j = Job(3)
    j.op(0, 0.0, 0.1)
    j.op(1, 0.0, 0.1)
    j.op(2, 0.0, 0.1)
    for r in (0, 1):
        j.start(r, 1.0, seq=1)
    j.m.mark_gone(2, "process ended without a goodbye")  # last heard from at 0.1 s
    # the others are alive (live watcher: now) — dead for 1.5 s is enough, no 10 s wait
    [d] = j.diagnoses(1.7)
    assert (d["kind"], d["op"], d["group"], d["seq"]) == ("dead_rank", "all_reduce", "0", 1)
    assert (d["waiting_ranks"], d["missing_ranks"], d["culprit_ranks"]) == ([0, 1], [2], [2])
    assert "rank 2 is dead and never entered it — its process ended without a goodbye" in d["message"]
    assert "its last op was all_reduce #0 on group 0, ended 1.6 s ago" in d["message"]
    assert j.status(1.7) == {0: "hung", 1: "hung", 2: "dead"}


def test_dead_rank_from_a_trace_exit_then_peer_error():
    # gloo: rank 1 exits mid-run, rank 0's next collective fails within milliseconds
    j = Job(2)
    j.op(0, 0.0, 0.1)
    j.op(1, 0.0, 0.1)
    j.m.ingest(1, Goodbye(int(0.2 * S)))
    a = j.start(0, 0.21, seq=1)
    j.end(0, a, 0.23, error="RuntimeError: Connection closed by peer [127.0.0.1]:1234")
    j.m.ingest(0, Goodbye(int(0.3 * S), reason="exception"))
    [d] = j.m.summary()["diagnoses"]
    assert (d["kind"], d["waiting_ranks"], d["missing_ranks"], d["culprit_ranks"]) == ("dead_rank", [0], [1], [1])
    assert "rank 0 failed after 20.0 ms (RuntimeError: Connection closed by peer" in d["message"]
    assert "rank 1 is dead and never entered it — it exited (exit)" in d["message"]


def test_rank_dying_inside_a_collective_is_dead_rank():
    j = Job(2)
    j.start(0, 1.0)
    j.start(1, 1.0)
    j.m.mark_gone(1, "process ended without a goodbye", t_ns=WALL0 + 1 * S)
    [d] = j.diagnoses(3.0)
    assert (d["kind"], d["waiting_ranks"], d["missing_ranks"], d["culprit_ranks"]) == ("dead_rank", [0], [1], [1])
    assert "rank 1 died inside it — its process ended" in d["message"]


def test_ranks_killed_together_are_a_hang_not_a_dead_rank():
    """A cut-off trace: everything was killed at the end, so nobody died first; the
    hang that was going on is what the summary reports."""
    j = Job(2, {"0": [0, 1], "1": [0, 1]})
    a = j.start(0, 1.0, group="1", seq=0)
    b = j.start(1, 1.0, op="broadcast", group="0", seq=0, root=0)
    j.m.ingest(0, OpStart(99, 1 * S, "x", "9", -1, 0))  # an unsequenced op: not part of any instance
    for r in (0, 1):  # heartbeats until the kill at ~14 s
        from commviz.events import Counters

        j.m.ingest(r, Counters(int(14.0 * S)))
    for r in (0, 1):
        j.m.mark_gone(r, "trace cut off")
    diags = j.m.summary()["diagnoses"]
    assert [d["kind"] for d in diags] == ["hang"]
    assert "its process ended (trace cut off)" in diags[0]["message"]
    assert a >= 0 and b >= 0


def test_ranks_the_watcher_stopped_say_so():
    """`record --hang-timeout` stopped the job: the post-mortem names who ended the
    ranks, not a guess that something killed them; a rank gone before the stop keeps
    its own story."""
    from commviz.events import Counters, Stopped

    j = Job(3, {"0": [0, 1, 2], "1": [0, 1]})
    j.start(0, 1.0, group="1", seq=0)
    j.start(1, 1.0, op="broadcast", group="0", seq=0, root=0)
    j.m.ingest(2, Goodbye(int(0.5 * S)))
    for r in (0, 1):
        j.m.ingest(r, Counters(int(4.0 * S)))
        j.m.ingest(r, Stopped(int(4.1 * S), "commviz record", "hang", 3.0))
    j.m.ingest(2, Stopped(int(4.1 * S), "commviz record", "hang", 3.0))  # already gone: ignored
    for r in (0, 1):
        j.m.mark_gone(r, "no goodbye in the trace (killed?)")
    assert j.m.gone_note(0) == "it was stopped by commviz record after 3 s (hang)"
    assert j.m.ranks[0].gone_reason == "stopped by commviz record after 3 s (hang)"
    assert j.m.gone_note(2) == "it exited (exit)"
    msg = " ".join(d["message"] for d in j.m.summary()["diagnoses"])
    assert "stopped by commviz record after 3 s" in msg and "killed?" not in msg


def test_ranks_the_watcher_stopped_apart_are_not_blamed_as_dead():
    """`record --hang-timeout` stops a hang (ranks 0 and 1 in an all_reduce of their
    group of three, rank 2 in a barrier with rank 3 instead). On a loaded box ranks 0
    and 1 went first, their ends reached the trace seconds before the others', and the
    barrier then failed on 2 and 3: the summary blamed 0 and 1 as dead ranks, in place
    of the hang they were stopped for, with rank 2 missing."""
    from commviz.events import Counters, Stopped

    j = Job(4, {"0": [0, 1, 2, 3], "1": [0, 1, 2]}, hang_after_s=1.0)  # as `summary` reads a trace
    for r in (0, 1):
        j.start(r, 1.0, group="1", seq=0)
    bars = {r: j.start(r, 1.1, op="barrier", group="0", seq=0) for r in (2, 3)}
    for r in range(4):
        j.m.ingest(r, Counters(int(7.0 * S)))
        j.m.ingest(r, Stopped(int(7.1 * S), "commviz record", "hang", 6.0))
    for r in (0, 1):
        j.m.mark_gone(r, "no goodbye in the trace (killed?)", int(7.2 * S))
    for r in (2, 3):  # seconds later: their barrier fails for want of 0 and 1, then they go
        j.end(r, bars[r], 10.0, error="Connection closed by peer")
        j.m.mark_gone(r, "no goodbye in the trace (killed?)", int(10.1 * S))
    kinds = {d["kind"]: d for d in j.m.summary()["diagnoses"]}
    assert "dead_rank" not in kinds
    d = kinds["hang"]
    assert (d["group"], d["missing_ranks"], d["culprit_ranks"]) == ("1", [2], [2])


@pytest.mark.parametrize("entered", [False, True])
def test_a_rank_silent_long_before_the_stop_is_still_a_dead_rank(entered):
    """Rank 2, on another host, was killed at 1.2 s (commviz hears of no death there
    but by silence); `record` stopped the job at 7.1 s and marked every rank it
    thought running, rank 2 too. Whether rank 2 never entered the all_reduce or died
    inside it, it is the dead rank, not a rank stopped with the run (or, inside it,
    nothing at all)."""
    from commviz.events import Counters, Stopped

    j = Job(3, {"0": [0, 1, 2]}, hang_after_s=1.0)
    for r in (0, 1) + ((2,) if entered else ()):
        j.start(r, 1.0, seq=0)
    j.m.ingest(2, Counters(int(1.2 * S)))
    for r in (0, 1):
        j.m.ingest(r, Counters(int(7.0 * S)))
    for r in range(3):
        j.m.ingest(r, Stopped(int(7.1 * S), "commviz record", "hang", 6.0))
    for r in range(3):
        j.m.mark_gone(r, "no goodbye in the trace (killed?)")
    diags = j.m.summary()["diagnoses"]
    assert [(d["kind"], d["culprit_ranks"]) for d in diags] == [("dead_rank", [2])], diags


def test_interrupted_job_is_not_a_dead_rank():
    j = Job(2)
    a = j.start(0, 1.0, seq=0)
    j.end(0, a, 1.001, error="KeyboardInterrupt: ")
    j.m.ingest(1, Goodbye(int(1.0 * S), reason="exit"))
    j.m.ingest(0, Goodbye(int(1.01 * S), reason="exit"))
    assert j.m.summary()["diagnoses"] == []


# --------------------------------------------------------------------- desync


@pytest.mark.parametrize(
    "field, bad, phrase",
    [
        ("op", dict(op="broadcast", root=0), "the op: rank 1 called broadcast, ranks 0,2,3 called all_reduce"),
        ("bytes", dict(nbytes=8192), "size: rank 1 passed 8192 B (shape [2048]), ranks 0,2,3 passed 4096 B (shape [1024])"),
        ("dtype", dict(dtype="float64"), "dtype: rank 1 passed float64, ranks 0,2,3 passed float32"),
        ("root", dict(op="broadcast", root=1), "root: rank 1 used root 1, ranks 0,2,3 used root 0"),
        ("reduce_op", dict(reduce_op="MAX"), "reduce op: rank 1 used reduce op MAX, ranks 0,2,3 used reduce op SUM"),
    ],
)
def test_desync_variants_name_who_differs_and_how(field, bad, phrase):
    j = Job(4)
    good = dict(op="broadcast", root=0) if field == "root" else dict(reduce_op="SUM") if field == "reduce_op" else {}
    for r in range(4):
        kw = dict(good, **bad) if r == 1 else dict(good)
        j.start(r, 1.0 + r * 0.001, seq=3, **kw)
    [d] = j.diagnoses(1.01)  # immediate: no threshold for a mismatch
    assert (d["kind"], d["group"], d["seq"], d["culprit_ranks"]) == ("desync", "0", 3, [1])
    assert d["op"] == ("broadcast" if field == "root" else "all_reduce")
    assert d["details"]["differs"] == [field]
    assert phrase in d["message"], d["message"]
    assert d["waiting_ranks"] == [0, 1, 2, 3] and d["missing_ranks"] == []
    # ... and it stays reported after the instance completes (when the hang threshold
    # passes, it is still a desync, not a hang)
    assert [x["kind"] for x in j.diagnoses(30.0)] == ["desync"]
    for r in range(4):
        j.end(r, 0, 1.02)
    [d2] = j.diagnoses(2.0)
    assert d2["kind"] == "desync" and "completed anyway" in d2["message"] and d2["waiting_ranks"] == []


def test_desync_with_a_rank_that_died_right_after_starting_it():
    """gloo aborts a rank on a shape mismatch; its start is all that is left."""
    j = Job(2)
    j.start(0, 1.0, nbytes=4096)
    j.start(1, 1.0, nbytes=2048)
    j.m.mark_gone(1, "process ended without a goodbye")
    j.end(0, 0, 1.01, error="RuntimeError: Connection reset by peer")
    j.m.ingest(0, Goodbye(int(1.05 * S), reason="exception"))
    diags = j.m.summary()["diagnoses"]
    assert [d["kind"] for d in diags] == ["desync"]  # the death is explained by it
    d = diags[0]
    assert d["culprit_ranks"] == [1]  # a tie: the lowest rank's value is the reference
    assert "rank 1 started it and never finished: its process ended without a goodbye" in d["message"]
    assert d["details"]["died"] == [1]
    assert "it failed on rank 0 (RuntimeError: Connection reset by peer)" in d["message"]


def test_no_desync_for_legitimately_different_arguments():
    j = Job(2)
    j.op(0, 1.0, 1.1, op="all_to_all_single", nbytes=4096, seq=0)  # uneven splits
    j.op(1, 1.0, 1.1, op="all_to_all_single", nbytes=8192, seq=0)
    j.op(0, 2.0, 2.1, op="all_gather_into_tensor", seq=1)  # the same collective by two names
    j.op(1, 2.0, 2.1, op="_all_gather_base", seq=1)
    j.op(0, 3.0, 3.1, op="broadcast_object_list", nbytes=0, dtype="", seq=2, root=0)
    j.op(1, 3.0, 3.1, op="broadcast_object_list", nbytes=0, dtype="", seq=2, root=0)
    assert j.diagnoses(4.0) == []


def test_p2p_size_mismatch_is_a_desync():
    j = Job(2)
    j.start(0, 1.0, op="send", seq=0, peer=1, nbytes=4096)
    j.start(1, 1.0, op="recv", seq=0, peer=0, nbytes=8192)
    [d] = j.diagnoses(1.1)
    assert (d["kind"], d["op"], d["group"], d["seq"], d["culprit_ranks"]) == ("desync", "send", "0", 0, [0, 1])
    assert "rank 0 sends 4096 B float32" in d["message"] and "rank 1 receives into 8192 B float32" in d["message"]


# --------------------------------------------------------------- p2p deadlock


def test_p2p_deadlock_both_ranks_recv_first():
    j = Job(2)
    a = j.start(0, 1.0, op="recv", seq=0, peer=1)
    b = j.start(1, 1.0, op="recv", seq=0, peer=0)
    j.stack(0, a, 11.0, torch_stack(40, "/home/me/p2p.py"))
    assert j.diagnoses(5.0) == []
    [d] = j.diagnoses(12.0)
    assert (d["kind"], d["op"], d["group"], d["seq"]) == ("p2p_deadlock", "recv", "0", 0)
    assert (d["waiting_ranks"], d["missing_ranks"], d["culprit_ranks"]) == ([0, 1], [0, 1], [0, 1])
    assert ("rank 0 in recv←1 #0 (p2p.py:40) waits for rank 1, which is in recv←0 #0 waiting for rank 0"
            in d["message"])
    assert [s["rank"] for s in d["stacks"]] == [0] and d["stacks"][0]["where"] == "p2p.py:40"
    assert j.status(12.0) == {0: "hung", 1: "hung"}
    assert b >= 0


def test_p2p_deadlock_three_rank_cycle():
    j = Job(3)
    j.start(0, 1.0, op="recv", seq=0, peer=1)
    j.start(1, 1.0, op="recv", seq=0, peer=2)
    j.start(2, 1.0, op="irecv", seq=0, peer=0, is_async=True)
    [d] = j.diagnoses(12.0)
    assert d["kind"] == "p2p_deadlock"
    assert (d["waiting_ranks"], d["culprit_ranks"], d["op"], d["seq"]) == ([0, 1, 2], [0, 1, 2], "recv", 0)
    assert ("rank 0 in recv←1 #0 waits for rank 1, which is in recv←2 #0 waiting for rank 2, "
            "which is in irecv←0 #0 waiting for rank 0") in d["message"]
    assert [(c["rank"], c["waits_for"]) for c in d["details"]["cycle"]] == [(0, 1), (1, 2), (2, 0)]


def test_p2p_waiting_on_a_peer_blocked_in_a_collective_it_needs_us_for():
    j = Job(2)
    j.start(0, 1.0, op="broadcast", seq=0, root=0)
    j.start(1, 1.0, op="recv", seq=0, peer=0)
    [d] = j.diagnoses(12.0)
    assert (d["kind"], d["op"], d["culprit_ranks"]) == ("p2p_deadlock", "recv", [0, 1])
    assert "rank 0 in broadcast #0 on group 0 waits for rank 1, which is in recv←0 #0 waiting for rank 0" in d["message"]


def test_p2p_chain_reports_the_root_and_lists_who_is_stuck_behind_it():
    j = Job(3)
    j.op(2, 0.0, 0.5, op="send", seq=0, peer=1)
    j.op(1, 0.0, 0.5, op="recv", seq=0, peer=2)
    j.start(0, 1.0, op="recv", seq=0, peer=1)  # waits for rank 1 …
    j.start(1, 1.0, op="recv", seq=1, peer=2)  # … which waits for rank 2, idle
    [d] = j.diagnoses(12.0)
    assert (d["kind"], d["op"], d["seq"]) == ("hang", "recv", 1)
    assert (d["waiting_ranks"], d["missing_ranks"], d["culprit_ranks"]) == ([1], [2], [2])
    assert d["message"].startswith("recv #1 on group 0 (rank 2 → rank 1): rank 1 waiting 11.0 s;")
    assert "rank 2 never posted the matching send — no op in flight — last op send→1 #0 on group 0" in d["message"]
    assert "also stuck behind it: rank 0 in recv←1 #0" in d["message"]
    assert d["details"]["also_blocked"][0]["waiting_ranks"] == [0]


def test_p2p_peer_dead_is_dead_rank():
    j = Job(2)
    j.start(0, 1.0, op="recv", seq=0, peer=1)
    j.m.mark_gone(1, "process ended without a goodbye", t_ns=WALL0 + 1 * S)
    [d] = j.diagnoses(3.0)
    assert (d["kind"], d["op"], d["waiting_ranks"], d["culprit_ranks"]) == ("dead_rank", "recv", [0], [1])
    assert "rank 1 is dead and never posted the matching send" in d["message"]


def test_matched_p2p_is_not_a_deadlock():
    j = Job(2)
    j.start(0, 1.0, op="irecv", seq=0, peer=1, is_async=True)
    j.start(1, 1.0, op="irecv", seq=0, peer=0, is_async=True)
    j.start(0, 1.0, op="isend", seq=0, peer=1, is_async=True)
    j.start(1, 1.0, op="isend", seq=0, peer=0, is_async=True)
    assert j.diagnoses(20.0) == []  # both matches posted: slow, not deadlocked
    for r in (0, 1):
        j.end(r, 0, 21.0)
        j.end(r, 1, 21.0)
    assert j.m.tracker.pairs == {}


# ------------------------------------------------------------------ straggler


def test_straggler_consistently_last_by_a_margin():
    j = Job(4)
    rng = random.Random(1)
    t = 0.0
    for seq in range(40):
        late = 0.005 if seq % 10 else 0.0  # rank 3 sleeps 5 ms before 36 of 40 collectives
        for r in range(4):
            arrive = t + (late if r == 3 else 0.0) + rng.uniform(0, 50e-6)
            j.op(r, arrive, t + late + 200e-6, seq=seq)
        t += 0.02
    [d] = j.diagnoses(t)
    assert (d["kind"], d["group"], d["op"], d["culprit_ranks"], d["waiting_ranks"]) == (
        "straggler", "0", "all_reduce", [3], [0, 1, 2])
    assert d["missing_ranks"] == [] and d["seq"] == 39
    assert d["details"]["last_count"] >= 35 and d["details"]["instances"] == 40
    assert 0.0049 < d["details"]["median_lateness_s"] < 0.0051
    assert "rank 3 arrives last at" in d["message"] and "a median 5.0 ms after the next-latest rank" in d["message"]


def test_straggler_on_two_ranks_needs_enough_evidence():
    j = Job(2)
    for seq in range(30):  # rank 1 sleeps 20 ms before every collective but the first
        t = 1.0 + seq * 0.05
        late = 0.02 if seq else -1e-5
        j.op(0, t, t + max(late, 0) + 1e-4, seq=seq)
        j.op(1, t + late, t + max(late, 0) + 1e-4, seq=seq)
        if seq == 14:
            assert j.diagnoses(t + 0.03) == []  # 14 of 15 could still be luck
    [d] = j.diagnoses(2.6)
    assert (d["kind"], d["culprit_ranks"], d["waiting_ranks"]) == ("straggler", [1], [0])
    assert d["details"]["last_count"] == 29


def test_two_rank_coin_flips_are_not_a_straggler():
    rng = random.Random(3)
    j = Job(2)
    for seq in range(500):  # who arrives last is a coin flip, by up to 3 ms
        t = seq * 0.01
        a = {r: t + rng.uniform(0, 3e-3) for r in (0, 1)}
        for r in (0, 1):
            j.op(r, a[r], max(a.values()) + 2e-4, seq=seq)
        assert j.diagnoses(t + 5e-3) == []


def test_small_systematic_lateness_is_not_a_straggler():
    j = Job(2)
    for seq in range(50):  # rank 0 always 50 µs behind (logging): below every floor
        j.op(0, seq * 0.01 + 50e-6, seq * 0.01 + 1e-3, seq=seq)
        j.op(1, seq * 0.01, seq * 0.01 + 1e-3, seq=seq)
    assert j.diagnoses(1.0) == []


# ---------------------------------------------------------------- healthy job


def test_healthy_jittery_job_produces_no_diagnosis_even_with_a_short_threshold():
    """4 ranks, all_reduce on the world and on two pair groups, a ring of p2p
    exchanges, random arrival jitter and durations — checked at every event, also
    mid-flight, with a 20 ms hang threshold."""
    rng = random.Random(7)
    groups = {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3]}
    j = Job(4, groups, hang_after_s=0.02)
    events: list[tuple[int, int, object]] = []  # (t ns, rank, event)
    ids = [0] * 4
    seqs = {g: 0 for g in groups}
    p2p = {}  # (dir, group, peer) per rank
    t = 0.0

    def add(rank, t0, t1, op, group, seq, **kw):
        op_id = ids[rank]
        ids[rank] += 1
        events.append((int(t0 * S), rank, OpStart(op_id, int(t0 * S), op, group, seq, 4096, "float32", [1024], **kw)))
        events.append((int(t1 * S), rank, OpEnd(op_id, int(t1 * S))))

    for step in range(120):
        gid = ["0", "1", "2"][step % 3]
        ranks = groups[gid]
        arrive = {r: t + rng.uniform(0, 3e-3) for r in ranks}
        done = max(arrive.values()) + rng.uniform(50e-6, 2e-3)
        for r in ranks:
            add(r, arrive[r], done + rng.uniform(0, 100e-6), "all_reduce", gid, seqs[gid])
        seqs[gid] += 1
        if step % 5 == 0:  # ring exchange: each rank isend→next, irecv←prev
            for r in range(4):
                nxt, prv = (r + 1) % 4, (r - 1) % 4
                ks = p2p.get((r, "s", nxt), 0)
                kr = p2p.get((r, "r", prv), 0)
                p2p[(r, "s", nxt)], p2p[(r, "r", prv)] = ks + 1, kr + 1
                t0 = done + rng.uniform(0, 2e-3)
                add(r, t0, t0 + rng.uniform(1e-3, 5e-3), "isend", "0", ks, peer=nxt, is_async=True)
                add(r, t0, t0 + rng.uniform(1e-3, 5e-3), "irecv", "0", kr, peer=prv, is_async=True)
        t = done + rng.uniform(1e-3, 8e-3)
    events.sort(key=lambda e: e[0])
    for tn, rank, ev in events:
        j.m.ingest(rank, ev)
        assert j.m.diagnoses(WALL0 + tn) == [], (tn, rank, ev)
        assert j.m.diagnoses(WALL0 + tn + 10 * MS) == []
    for r in range(4):
        j.m.ingest(r, Goodbye(int((t + 0.01) * S)))
    s = j.m.summary()
    assert s["diagnoses"] == []
    assert [r["status"] for r in s["ranks"]] == ["exited"] * 4
    assert j.m.pending == {} and j.m.tracker.pairs == {}


# ---------------------------------------------------------------- stacks


def test_user_frame_is_the_innermost_frame_of_the_users_code():
    frames = torch_stack(88)
    assert user_frame_index(frames) == 2
    # the rank's own library directories win over path patterns
    odd = [Frame("/opt/myorg/lib/launch.py", 1, "main"), Frame("/opt/vendor/fw/comm.py", 9, "sync")]
    assert user_frame_index(odd) == 1
    assert user_frame_index(odd, ["/opt/vendor"]) == 0
    # no user code at all: a third-party library frame is the next best thing
    lib = [Frame("/venv/lib/python3.11/site-packages/lightning/fabric/strategies/ddp.py", 5, "reduce"),
           Frame("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 1, "all_reduce")]
    assert user_frame_index(lib) == 0
    assert user_frame_index(lib[1:]) is None


@pytest.mark.parametrize(
    "path, rank",
    [
        ("/usr/lib/python3.11/threading.py", INTERNAL),
        ("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", INTERNAL),
        ("/src/pytorch/torch/nn/parallel/distributed.py", INTERNAL),
        ("/venv/lib/python3.11/site-packages/commviz/probe/patch.py", INTERNAL),
        ("/home/me/commviz/commviz/probe/patch.py", INTERNAL),
        ("<frozen runpy>", INTERNAL),
        ("/venv/lib/python3.11/site-packages/deepspeed/comm/comm.py", LIBRARY),
        ("/home/me/proj/train.py", USER),
        ("/home/me/commviz/scenarios/hang.py", USER),
    ],
)
def test_frame_classification_by_path(path, rank):
    assert frame_rank(path) == rank


def test_stacks_are_bounded_and_follow_the_op():
    j = Job(2)
    for k in range(20):
        j.start(0, 1.0 + k, seq=k) if k == 0 else None
        j.stack(0, k, 2.0 + k, torch_stack(10 + k))
    st = j.m.ranks[0].stacks
    assert len(st) == 8 and st.for_op(19).where() == "train.py:29" and st.for_op(0) is None
    rows = j.m.rank_rows(WALL0 + 30 * S)
    assert rows[0].where == ""  # its current op (id 0) has no stack any more


# ----------------------------------------------------------- summary document


def test_summary_json_carries_the_diagnoses_with_the_design_fields():
    j = Job(2)
    a = j.start(0, 1.0, seq=0)
    j.stack(0, a, 11.0, torch_stack(7))
    s = j.m.summary(WALL0 + 15 * S)
    [d] = s["diagnoses"]
    assert DESIGN_KEYS <= set(d)
    assert isinstance(d["group"], str) and isinstance(d["seq"], int) and isinstance(d["message"], str)
    assert json.loads(json.dumps(s)) == s
    assert [r["status"] for r in s["ranks"]] == ["hung", "ok"]
    # summary() without `now` uses the newest event's time: the same trace, the same answer
    j.m.ingest(1, Goodbye(int(15 * S)))
    assert j.m.summary()["diagnoses"][0]["kind"] == "dead_rank"


def test_memory_stays_bounded_when_starts_are_lost():
    j = Job(2)
    n = 3000
    for seq in range(n):
        j.op(0, seq * 1e-3, seq * 1e-3 + 1e-4, seq=seq)
        if seq % 2:  # rank 1's even ops were dropped on the way
            j.op(1, seq * 1e-3, seq * 1e-3 + 1e-4, seq=seq)
    assert len(j.m.pending) <= 1100
    [row] = j.m.summary()["ops"]
    assert row["count"] == n
    assert j.diagnoses(n * 1e-3 + 20) == []


def test_a_restarted_rank_leaves_its_old_ops_behind():
    j = Job(2)
    j.start(0, 1.0, seq=0)
    j.start(1, 1.0, seq=0, nbytes=64)  # a desync …
    assert j.diagnoses(1.1)[0]["kind"] == "desync"
    j.m.ingest(1, hello(1, pid=4242))  # … of a process that was replaced
    assert j.m.pending[("0", 0)].starts.keys() == {0}
    assert [d["kind"] for d in j.diagnoses(1.2)] == []

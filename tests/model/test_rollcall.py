"""The culprit's line when it is in no op, and the roll-call (issue 30, items 1-2): a
rank the others wait for that is busy outside any collective has its quiet stack in
the diagnosis, and at 1,024 ranks the diagnosis groups ranks by where they are and
stays small."""

from __future__ import annotations

import json

from commviz.events import QUIET_OP, Frame, GroupDef, OpEnd, OpStart, Stack
from commviz.model import Model
from tests.helpers import WALL0, hello

S = 1_000_000_000


def user_stack(file: str, line: int, function: str, inner: list[Frame] = ()) -> list[Frame]:
    return [Frame("<frozen runpy>", 88, "_run_code"), Frame(f"/home/me/proj/{file}", line, function, "x()"),
            *inner]


def in_collective(line: int) -> list[Frame]:
    return user_stack("train.py", line, "step", [
        Frame("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2501, "all_reduce")])


def job(world: int) -> Model:
    m = Model()
    for r in range(world):
        m.ingest(r, hello(r, world=world))
        m.ingest(r, GroupDef("0", list(range(world)), "gloo"))
    for r in range(world):  # one healthy all_reduce each
        m.ingest(r, OpStart(0, 1 * S, "all_reduce", "0", 0, 4096, "float32", [1024]))
        m.ingest(r, OpEnd(0, 1 * S + 1000))
    return m


def hang(world: int, odd: dict[int, tuple[str, int, str]], t_hang: float = 20.0) -> dict:
    """Every rank but `odd` enters all_reduce #1 at 5 s (stack at train.py:88); each odd
    rank sends a quiet capture from where it is (its main thread there, and an idle
    helper thread) and never enters."""
    m = job(world)
    for r in range(world):
        if r in odd:
            file, line, fn = odd[r]
            t = 9 * S
            m.ingest(r, Stack(t, QUIET_OP, "MainThread", user_stack(file, line, fn)))
            m.ingest(r, Stack(t, QUIET_OP, "Thread-1 (loader)", [Frame("/usr/lib/python3.11/threading.py", 320, "wait")]))
        else:
            m.ingest(r, OpStart(1, 5 * S, "all_reduce", "0", 1, 4096, "float32", [1024]))
            m.ingest(r, Stack(8 * S, 1, "MainThread", in_collective(88)))
    [d] = [d for d in m.diagnoses(WALL0 + int(t_hang * S)) if d["kind"] == "hang"]
    return d


def test_the_missing_rank_in_no_op_has_its_stack_and_its_line_in_the_message():
    d = hang(4, {2: ("pipe.py", 41, "slow_step")})
    assert d["missing_ranks"] == [2]
    assert "rank 2 never entered it — no op in flight" in d["message"]
    assert "now in slow_step (pipe.py:41)" in d["message"]
    stacks = {s["rank"]: s for s in d["stacks"]}
    assert sorted(stacks) == [0, 1, 2, 3]
    assert stacks[2]["user_frame"]["function"] == "slow_step" and stacks[2]["thread"] == "MainThread"
    assert d["details"]["missing"][0]["where"] == "pipe.py:41"


def test_a_quiet_stack_older_than_the_ranks_last_op_is_not_its_place_now():
    m = job(2)
    m.ingest(1, Stack(int(0.5 * S), QUIET_OP, "MainThread", user_stack("data.py", 7, "load")))  # before op 0 ended
    m.ingest(0, OpStart(1, 5 * S, "all_reduce", "0", 1, 4096, "float32", [1024]))
    [d] = m.diagnoses(WALL0 + 20 * S)
    assert "data.py" not in d["message"] and all(s["rank"] != 1 for s in d["stacks"])


def test_roll_call_names_the_odd_groups_first_at_1024_ranks_and_stays_small():
    odd = {17: ("ckpt.py", 12, "save")} | {r: ("data.py", 41, "load_shard") for r in (5, 9, 700)}
    d = hang(1024, odd)
    rc = d["details"]["roll_call"]
    groups = [(g["count"], g["op"], g["where"], g["function"], g["ranks"]) for g in rc["groups"]]
    assert groups == [(1, "", "ckpt.py:12", "save", "17"), (3, "", "data.py:41", "load_shard", "5,9,700"),
                      (1020, "all_reduce", "train.py:88", "step", "0-4,6-8,10-16,18-699,701-1023")]
    line = d["message"].split("roll-call: ", 1)[1]
    assert line.startswith("rank 17 in no op, in save at ckpt.py:12 · 3 ranks (5,9,700) in no op, in load_shard at "
                           "data.py:41 · 1020 ranks (0-4,6-8,10-16,")
    # one stack per group and the culprits' own, not one per rank; the per-rank lists capped
    assert sorted(s["rank"] for s in d["stacks"]) == [0, 5, 9, 17, 700]
    assert d["details"]["waits_more"] == 1020 - 32 and len(d["details"]["waits"]) == 32
    assert len(json.dumps(d)) < 40_000


def test_a_newer_quiet_capture_replaces_the_last_one_whole():
    from commviz.model.stacks import StackStore

    st = StackStore()
    st.add(Stack(1, QUIET_OP, "MainThread", user_stack("a.py", 1, "f")), 1)
    st.add(Stack(1, QUIET_OP, "Thread-1", user_stack("b.py", 2, "g")), 1)
    st.add(Stack(2, QUIET_OP, "MainThread", user_stack("c.py", 3, "h")), 2)
    assert [s.where() for s in st.quiet()] == ["c.py:3"] and st.quiet(since_wall=3) == []


def test_a_thousand_ranks_each_somewhere_else_still_make_a_small_diagnosis():
    odd = {r: ("data.py", 1000 + r, f"load_{r}") for r in range(24, 1024)}
    d = hang(1024, odd)
    assert len(d["stacks"]) <= 16 and len(d["details"]["roll_call"]["groups"]) == 32
    assert d["details"]["roll_call"]["more_groups"] == 1001 - 32
    assert len(json.dumps(d)) < 60_000

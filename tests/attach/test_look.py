"""What attach saw, as events the model reads: the same hang diagnosis a live probe
would give, from two looks at each rank's stacks."""

from commviz.attach.discover import Job, Launcher, RankProc
from commviz.attach.look import RankLook, op_of, to_batches
from commviz.attach.pyspy import ThreadStack
from commviz.events import Frame
from commviz.model import Model
from commviz.model.thresholds import Thresholds

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
S = 1_000_000_000


def in_c10d(op: str, line: int, **locs) -> ThreadStack:
    frames = [Frame("/home/me/train.py", 100, "<module>"), Frame("/home/me/train.py", line, "step"),
              Frame(C10D, 2500, op)]
    return ThreadStack("MainThread", frames, [{}, {}, {k: str(v) for k, v in locs.items()}])


def elsewhere(fn: str, line: int) -> ThreadStack:
    return ThreadStack("MainThread", [Frame("/home/me/train.py", 100, "<module>"), Frame("/home/me/data.py", line, fn),
                                      Frame("/usr/lib/python3.11/threading.py", 320, "wait")], [{}, {}, {}])


def job(n: int) -> Job:
    return Job("torchrun:x", [RankProc(1000 + r, r, n, r, Launcher.TORCHRUN, "torchrun:x", ("python",))
                              for r in range(n)])


def looks(j: Job, t: int, stacks: dict[int, ThreadStack]) -> dict[int, RankLook]:
    return {p.rank: RankLook(p, t, [stacks[p.rank]]) for p in j.ranks}


def diagnose(j, first, second):
    obs = to_batches(j, first, second)
    m = Model(thresholds=Thresholds(hang_after_s=obs.hang_after_s), flows=False)
    for b in obs.batches:
        for ev in b.events:
            m.ingest(b.rank, ev)
    return m.summary(obs.now_wall)


def test_a_rank_in_no_op_while_the_others_wait_in_all_reduce_is_the_culprit_with_its_line():
    j = job(4)
    st = {0: in_c10d("all_reduce", 88, group=None), 1: in_c10d("all_reduce", 88, group=None),
          2: elsewhere("load_shard", 41), 3: in_c10d("all_reduce", 88, group=None)}
    s = diagnose(j, looks(j, 0, st), looks(j, 2 * S, st))
    [d] = s["diagnoses"]
    assert (d["kind"], d["op"], d["waiting_ranks"], d["missing_ranks"]) == ("hang", "all_reduce", [0, 1, 3], [2])
    assert "now in load_shard (data.py:41)" in d["message"] and "ranks 0,1,3 waiting 2.0 s" in d["message"]
    assert {x["rank"]: x["where"] for x in d["stacks"]}[2] == "data.py:41"
    assert [p["rank"] for p in s["per_rank"]] == [0, 1, 2, 3]


def test_a_rank_that_only_passes_through_a_collective_is_not_stuck_in_it():
    j = job(2)
    a = {0: in_c10d("all_reduce", 88, group=None), 1: elsewhere("load_shard", 41)}
    b = {0: elsewhere("load_shard", 41), 1: in_c10d("all_reduce", 88, group=None)}
    s = diagnose(j, looks(j, 0, a), looks(j, 2 * S, b))
    assert s["diagnoses"] == []  # rank 1 just entered: no 2 s in it yet


def test_p2p_peers_come_from_the_locals():
    hit = op_of(in_c10d("send", 30, dst=3, group="<ProcessGroup object at 0x1>"))
    assert (hit.op, hit.peer, hit.group) == ("send", 3, "0")
    assert op_of(elsewhere("f", 1)) is None


def test_unreadable_ranks_are_said_and_leave_no_invented_op():
    j = job(2)
    st = {0: in_c10d("all_reduce", 88, group=None), 1: elsewhere("x", 1)}
    second = looks(j, 2 * S, st)
    second[1] = RankLook(j.ranks[1], 2 * S, None, "ptrace refused for pid 1001")
    obs = to_batches(j, looks(j, 0, st), second)
    assert obs.unread == {1: "ptrace refused for pid 1001"}
    assert [type(e).__name__ for e in obs.batches[1].events] == ["Hello", "GroupDef"]


def test_ranks_read_one_after_another_are_all_hung_when_none_moved():
    """py-spy reads ranks in turn: the last rank of the first look was watched for less
    than the looks' span. Every rank that stayed in its op through both looks is hung."""
    j = job(4)
    st = {0: in_c10d("send", 29, dst=1), 1: in_c10d("send", 29, dst=2), 2: elsewhere("load_next_shard", 17),
          3: in_c10d("recv", 25, src=2)}
    step = S // 5  # 0.2 s per rank read
    first = {p.rank: RankLook(p, p.rank * step, [st[p.rank]]) for p in j.ranks}
    second = {p.rank: RankLook(p, S + 3 * step + p.rank * step, [st[p.rank]]) for p in j.ranks}
    s = diagnose(j, first, second)
    status = {r["rank"]: r["status"] for r in s["ranks"]}
    assert status == {0: "hung", 1: "hung", 2: "ok", 3: "hung"}
    assert {d["op"] for d in s["diagnoses"] if d["kind"] == "hang"} == {"send", "recv"}

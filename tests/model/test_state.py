"""The model answers what the job did: exact counts and bytes, per instance timing,
status, and it is not fooled by resent or out-of-order events."""

import pytest

from commviz.events import Counters, Goodbye, Mark, OpEnd, OpStart
from commviz.model import Model, ledger
from tests.helpers import WALL0, group, hello, op


def feed(m: Model, rank: int, events):
    for e in events:
        m.ingest(rank, e)


def two_rank_job(m: Model, iters: int = 10, nbytes: int = 4096):
    for r in (0, 1):
        feed(m, r, [hello(r), group()])
    for i in range(iters):
        # rank 1 arrives 300 ns later each time; the transfer itself takes 1000 ns
        feed(m, 0, op(i, 10_000 * i, 10_000 * i + 1300, seq=i, nbytes=nbytes))
        feed(m, 1, op(i, 10_000 * i + 300, 10_000 * i + 1300, seq=i, nbytes=nbytes))


def test_collective_counts_once_per_instance_and_per_rank():
    m = Model()
    two_rank_job(m, iters=10)
    s = m.summary()
    [row] = s["ops"]
    assert (row["op"], row["group"], row["count"], row["bytes"]) == ("all_reduce", "0", 10, 40960)
    assert [pr["ops"] for pr in s["per_rank"]] == [{"all_reduce": {"count": 10, "bytes": 40960}}] * 2


def test_instance_time_is_the_last_arrivers_duration():
    m = Model()
    two_rank_job(m, iters=4)
    [row] = m.summary()["ops"]
    assert row["p50_us"] == pytest.approx(1.0)  # 1000 ns, not rank 0's 1300 ns
    assert row["algbw_gbps"] == pytest.approx(4096 / 1000)  # bytes per ns == GB/s
    assert row["busbw_gbps"] == pytest.approx(4096 / 1000 * 1.0)  # all_reduce, n=2: 2(n-1)/n = 1


def test_busbw_uses_the_groups_size():
    m = Model()
    for r in range(4):
        feed(m, r, [hello(r, world=4), group(ranks=range(4))])
        feed(m, r, op(0, 0, 2000, nbytes=8000))
    [row] = m.summary()["ops"]
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 1.5)


def test_percentiles():
    m = Model()
    feed(m, 0, [hello(0, world=1), group(ranks=[0])])
    for i in range(100):
        feed(m, 0, op(i, 0, (i + 1) * 1000, seq=i))
    [row] = m.summary()["ops"]
    assert row["p50_us"] == pytest.approx(50.0)
    assert row["p99_us"] == pytest.approx(99.0)


def test_p2p_ops_count_per_rank_event():
    m = Model()
    for r in (0, 1):
        feed(m, r, [hello(r), group()])
    for k in range(3):
        feed(m, 0, op(k, 0, 500, name="send", seq=k, peer=1))
        feed(m, 1, op(k, 0, 500, name="recv", seq=k, peer=0))
    rows = {r["op"]: r for r in m.summary()["ops"]}
    assert rows["send"]["count"] == 3 and rows["recv"]["count"] == 3
    assert rows["send"]["bytes"] == 3 * 4096


def test_resent_starts_after_reconnect_are_not_counted_twice():
    m = Model()
    feed(m, 0, [hello(0, world=1), group(ranks=[0])])
    start = OpStart(5, 100, "all_reduce", "0", 0, 64)
    # a resync carrying the in-flight op arrives before the batch that started it
    feed(m, 0, [hello(0, world=1), start, start, OpEnd(5, 200), start])
    s = m.summary()
    assert s["per_rank"][0]["ops"]["all_reduce"]["count"] == 1
    assert m.duplicates >= 3


def test_out_of_order_older_ops_still_count():
    m = Model()
    feed(m, 0, [hello(0, world=1), group(ranks=[0])])
    feed(m, 0, [OpStart(7, 700, "all_reduce", "0", 2, 64)])  # in-flight op, from a resync
    for i in range(7):  # the backlog of older ops arrives afterwards
        feed(m, 0, op(i, i * 100, i * 100 + 50, seq=i, nbytes=64))
    assert m.summary()["per_rank"][0]["ops"]["all_reduce"]["count"] == 7


def test_partial_trace_still_reports_unfinished_instances():
    m = Model()
    for r in (0, 1):
        feed(m, r, [hello(r), group()])
    feed(m, 0, op(0, 0, 1000))  # rank 1's record of the same instance never arrived
    [row] = m.summary()["ops"]
    assert row["count"] == 1 and row["bytes"] == 4096
    # ... and finishing it later does not count it twice
    feed(m, 1, op(0, 0, 900))
    [row] = m.summary()["ops"]
    assert row["count"] == 1


def test_status_waiting_then_hung_then_exited():
    m = Model(hang_after_s=10)
    feed(m, 0, [hello(0, world=1), group(ranks=[0]), OpStart(0, 0, "all_reduce", "0", 0, 64)])
    assert m.summary(now=WALL0 + 1_000_000_000)["ranks"][0]["status"] == "waiting"
    assert m.summary(now=WALL0 + 11_000_000_000)["ranks"][0]["status"] == "hung"
    feed(m, 0, [OpEnd(0, 12_000_000_000), Goodbye(13_000_000_000)])
    assert m.summary(now=WALL0 + 20_000_000_000)["ranks"][0]["status"] == "exited"


def test_rank_rows_show_current_op_and_duration():
    m = Model()
    feed(m, 0, [hello(0, world=1), group(ranks=[0]), OpStart(0, 1_000_000_000, "broadcast", "0", 0, 64, root=0)])
    [row] = m.rank_rows(now=WALL0 + 3_000_000_000)
    assert row.op == "broadcast#0" and row.in_op_s == pytest.approx(2.0)
    assert row.status == "waiting"


def test_errors_are_counted_not_timed():
    m = Model()
    feed(m, 0, [hello(0, world=1), group(ranks=[0])])
    feed(m, 0, [OpStart(0, 0, "all_reduce", "0", 0, 64), OpEnd(0, 100, error="RuntimeError: peer gone")])
    [row] = m.summary()["ops"]
    assert row["errors"] == 1 and row["p50_us"] == 0.0


def test_dead_and_counters():
    m = Model()
    feed(m, 0, [hello(0, world=1), Counters(5, dropped=7)])
    m.mark_gone(0, "process ended")
    r = m.summary()["ranks"][0]
    assert (r["status"], r["dropped"]) == ("dead", 7)


def test_new_job_after_the_old_one_exited_starts_afresh():
    m = Model()
    two_rank_job(m, iters=3)
    for r in (0, 1):
        feed(m, r, [Goodbye(10**6)])
    feed(m, 0, [hello(0, job="second", pid=5)])
    s = m.summary()
    assert [r["rank"] for r in s["ranks"]] == [0] and s["ops"] == []


def test_marks_are_kept_with_wall_time():
    m = Model()
    feed(m, 0, [hello(0, world=1, mono=50), Mark(100, "step 10")])
    assert m.marks == [(WALL0 + 100, 0, "step 10")]


def test_timestamps_from_two_hosts_line_up_on_wall_clock():
    m = Model()
    # host A's monotonic clock is at 0 at wall W; host B's is at 5e9 at the same wall time
    feed(m, 0, [hello(0, mono=0, host="a", wall=WALL0), group()])
    feed(m, 1, [hello(1, mono=5_000_000_000, host="b", wall=WALL0), group()])
    feed(m, 0, [OpStart(0, 1000, "all_reduce", "0", 0, 64)])
    feed(m, 1, [OpStart(0, 5_000_001_000, "all_reduce", "0", 0, 64)])
    assert m.ranks[0].inflight[0].t_wall == m.ranks[1].inflight[0].t_wall


def test_ops_nobody_has_finished_are_not_counted_yet():
    m = Model()
    for r in (0, 1):
        feed(m, r, [hello(r), group()])
    feed(m, 0, [OpStart(0, 100, "all_reduce", "0", 0, 64)])
    feed(m, 1, [OpStart(0, 120, "all_reduce", "0", 0, 64)])
    assert m.summary()["ops"] == []
    assert sorted(m.pending[("0", 0)].starts) == [0, 1]  # but who is inside is known
    feed(m, 0, [OpEnd(0, 200)])
    assert m.summary()["ops"][0]["count"] == 1


def test_a_stale_instance_is_swept_when_its_group_names_a_member_twice():
    """A GroupDef is taken as sent, duplicates and all: the sweep asks each member
    once. Rank 0's start of seq 4 was lost, rank 1 entered and left it and is at seq
    4 still; rank 0 has since moved on: seq 4 can never complete and is retired."""
    m = Model()
    for r in (0, 1):
        m.ingest(r, hello(r))
        m.ingest(r, group("g", (0, 1, 1)))
    for seq in range(5):  # rank 0's frame of seqs 0-4 lost
        for ev in op(seq, 10 * seq, 10 * seq + 5, gid="g", seq=seq):
            m.ingest(1, ev)
    m.ingest(0, op(5, 60, 65, gid="g", seq=5)[0])  # rank 0 is inside seq 5
    ledger.sweep(m)  # the sweep's rule itself (where it runs is the columns tests' business)
    assert sorted(m.pending) == [("g", 5)]


def test_ingest_takes_its_three_shapes_and_refuses_a_batch_with_the_fix():
    """`ingest(rank, Batch)` once counted a phantom event and ingested nothing."""
    import numpy as np
    import pytest

    from commviz.events import Batch

    m = Model()
    assert m.ingest(np.int64(0), hello(0)) == 1 and list(m.ranks) == [0] and type(list(m.ranks)[0]) is int
    with pytest.raises(TypeError, match=r"ingest\(\[b\.rank\] \* len\(b\.events\), b\.events\)"):
        m.ingest(1, Batch(1, 1, [hello(1)]))
    with pytest.raises(TypeError, match="store.Chunk"):
        m.ingest([hello(1)])
    assert m.ingest([1, 1], [hello(1), group()]) == 2 and m.events == 3

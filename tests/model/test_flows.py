"""Edge flows and throughput derived from ops: the rules, the rates, the bounds."""

from __future__ import annotations

import pytest

from commviz.events import GroupDef, OpEnd, OpStart
from commviz.model import flows as fl
from commviz.model.flows import EXACT, HUB, MODELLED, edge_bytes
from commviz.model.state import Model
from commviz.model.throughput import Throughput

from ..helpers import hello

MS = 1_000_000
S = 1_000_000_000
T0 = 1_000 * S  # wall ns (hello wall = mono: offset 0 when mono=wall)


def model_with(n: int, gid: str = "0", ranks=None) -> Model:
    m = Model()
    ranks = list(range(n)) if ranks is None else ranks
    for r in range(n):
        m.ingest(r, hello(r, world=n, mono=0, wall=0))
    for r in ranks:
        m.ingest(r, GroupDef(gid, ranks, "gloo"))
    return m


def collective(m: Model, ranks, op: str, seq: int, nbytes: int, t: int, dur: int = 2 * MS, gid: str = "0",
               root: int = -1, op_id: int | None = None) -> None:
    oid = seq if op_id is None else op_id
    for r in ranks:
        m.ingest(r, OpStart(oid, t, op, gid, seq, nbytes, root=root))
    for r in ranks:
        m.ingest(r, OpEnd(oid, t + dur))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_all_reduce_moves_2_n_minus_1_over_n_S_to_each_neighbour(n):
    S_ = 1 << 20
    m = model_with(n)
    collective(m, range(n), "all_reduce", 0, S_, T0)
    f = m.traffic.flows
    want = 2 * (n - 1) / n * S_
    for r in range(n):
        nxt = (r + 1) % n
        assert f.total(r, nxt) == (0.0, pytest.approx(want))
    # Nothing else moves: exactly n ring edges.
    assert sorted(f.edges) == sorted((r, (r + 1) % n) for r in range(n))


def test_ring_follows_group_order_and_subgroups():
    m = model_with(4, gid="g", ranks=[3, 1, 2])  # a subgroup, in its own order
    collective(m, [3, 1, 2], "reduce_scatter_tensor", 0, 300, T0, gid="g")
    f = m.traffic.flows
    assert sorted(f.edges) == [(1, 2), (2, 3), (3, 1)]
    assert f.total(3, 1) == (0.0, pytest.approx(200.0))  # (n-1)/n * S


def test_send_recv_are_exact_and_counted_once():
    m = model_with(2)
    m.ingest(0, OpStart(10, T0, "send", "0", 0, 4096, peer=1))
    m.ingest(1, OpStart(10, T0, "recv", "0", 0, 4096, peer=0))
    m.ingest(1, OpEnd(10, T0 + MS))
    m.ingest(0, OpEnd(10, T0 + MS))
    f = m.traffic.flows
    assert f.total(0, 1) == (4096.0, 0.0)
    assert (1, 0) not in f.edges
    rates = f.rates(T0 + MS)
    assert rates[(0, 1)].exact_Bps == pytest.approx(4096.0) and not rates[(0, 1)].modelled


def test_recv_from_any_source_and_failed_ops():
    m = model_with(3)
    m.ingest(2, OpStart(1, T0, "isend", "0", 0, 100, peer=0))
    m.ingest(2, OpEnd(1, T0 + MS, error="RuntimeError: peer gone"))
    assert m.traffic.flows.edges == {}  # a failed op moved nothing we can count
    assert m.traffic.throughput.rate(T0 + MS)[1] == pytest.approx(1.0)  # but it was an op


def test_rules_for_rooted_and_all_to_all():
    members = [0, 1, 2, 3]
    assert edge_bytes("broadcast", 100, 2, members, root=0) == [(0, 2, 100.0, MODELLED)]
    assert edge_bytes("broadcast", 100, 0, members, root=0) == []  # the root receives nothing
    assert edge_bytes("reduce", 100, 3, members, root=1) == [(3, 1, 100.0, MODELLED)]
    assert edge_bytes("gather", 400, 3, members, root=1) == [(3, 1, 100.0, MODELLED)]
    assert edge_bytes("scatter", 400, 2, members, root=0) == [(0, 2, 100.0, MODELLED)]
    assert edge_bytes("all_to_all_single", 400, 1, members) == [
        (1, 0, 100.0, MODELLED), (1, 2, 100.0, MODELLED), (1, 3, 100.0, MODELLED)]
    assert edge_bytes("all_gather_into_tensor", 400, 3, members) == [(3, 0, 300.0, MODELLED)]
    assert edge_bytes("barrier", 0, 1, members) == []
    assert edge_bytes("isend", 64, 1, [], peer=3) == [(1, 3, 64.0, EXACT)]
    assert edge_bytes("irecv", 64, 1, [], peer=3) == []
    big = list(range(64))
    (edge,) = edge_bytes("all_to_all", 6400, 5, big)
    assert edge[:2] == (5, HUB) and edge[2] == pytest.approx(6300.0)


def test_broadcast_in_the_model_credits_root_to_each():
    m = model_with(4)
    collective(m, range(4), "broadcast", 0, 1000, T0, root=2)
    f = m.traffic.flows
    assert sorted(f.edges) == [(2, 0), (2, 1), (2, 3)]
    assert all(f.total(*k) == (0.0, 1000.0) for k in f.edges)


def test_rates_are_bytes_per_second_over_the_last_second_and_fall_to_zero():
    m = model_with(2)
    # 10 all_reduces of 1 MB, one every 100 ms: 2(n-1)/n = 1 -> 1 MB per op per edge.
    for i in range(10):
        collective(m, (0, 1), "all_reduce", i, 1_000_000, T0 + i * 100 * MS, dur=MS)
    f = m.traffic.flows
    now = T0 + 1000 * MS
    r = f.rates(now)
    assert r[(0, 1)].modelled_Bps == pytest.approx(10e6, rel=0.05)
    assert r[(0, 1)].op == "all_reduce" and r[(0, 1)].modelled
    assert f.rates(now + 3 * S) == {}  # a quiet (or hung) job shows nothing moving
    gbps, ops = m.traffic.throughput.rate(now)
    assert gbps == pytest.approx(0.02, rel=0.05)  # both edges, 10 MB/s each
    assert ops == pytest.approx(20, rel=0.05)  # 10 ops on each of 2 ranks


def test_a_long_wait_is_not_counted_as_transfer_time():
    m = model_with(2)
    # Rank 0 waits 5 s for rank 1; the transfer itself takes 1 ms.
    m.ingest(0, OpStart(0, T0, "all_reduce", "0", 0, 1_000_000))
    m.ingest(1, OpStart(0, T0 + 5 * S, "all_reduce", "0", 0, 1_000_000))
    m.ingest(0, OpEnd(0, T0 + 5 * S + MS))
    m.ingest(1, OpEnd(0, T0 + 5 * S + MS))
    r = m.traffic.flows.rates(T0 + 5 * S + 2 * MS)
    assert r[(0, 1)].modelled_Bps == pytest.approx(1e6)  # all of it inside the last second


def test_long_transfer_is_spread_over_its_duration():
    m = model_with(2)
    collective(m, (0, 1), "all_reduce", 0, 4_000_000, T0, dur=4 * S)
    r = m.traffic.flows.rates(T0 + 4 * S)
    assert r[(0, 1)].modelled_Bps == pytest.approx(1e6, rel=0.01)  # 4 MB over 4 s


def test_reset_starts_afresh():
    m = model_with(2)
    collective(m, (0, 1), "all_reduce", 0, 100, T0)
    tr = m.traffic
    assert tr.flows.edges
    m.reset()
    assert m.traffic is not tr and not m.traffic.flows.edges


def test_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(fl, "MAX_EDGES", 100)
    f = fl.FlowModel()
    for i in range(1000):
        f.credit(i, i + 1, 10.0, EXACT, T0 + i * MS, T0 + i * MS + 1, "send")
    assert len(f.edges) <= 101 and f.evicted >= 899
    assert (999, 1000) in f.edges  # the newest stay
    assert len(f.buckets) <= fl.KEEP_BUCKETS + 1
    tp = Throughput(slots=8, rank_slots=4)
    for i in range(1000):
        tp.add_op(i % 3, i)
        tp.add_bytes(0, 1, i, 1.0)
    tp.flush()
    assert len(tp.total.tx) == 8 and all(len(r.tx) == 4 for r in tp.ranks.values())


def test_throughput_series_per_rank_and_total():
    m = model_with(4)
    for i in range(4):
        collective(m, range(4), "all_gather_into_tensor", i, 4_000_000, T0 + i * 250 * MS, dur=MS)
    tp = m.traffic.throughput
    now = T0 + 1000 * MS
    tot = tp.series(now, 8)
    assert len(tot["gbps"]) == 8 and tot["gbps"][-1] == 0.0
    # Each bucket of 250 ms: 4 ranks x 3 MB = 12 MB -> 0.048 GB/s; 4 ops -> 16 ops/s.
    assert tot["gbps"][-2] == pytest.approx(0.048)
    assert tot["ops"][-2] == pytest.approx(16.0)
    one = tp.series(now, 8, rank=2)
    assert one["gbps"][-2] == pytest.approx(0.012) and one["rx_gbps"][-2] == pytest.approx(0.012)
    assert tp.series(now, 4, rank=99)["gbps"] == [0.0] * 4


def _traffic_state(t: fl.Traffic) -> tuple:
    f, tp = t.flows, t.throughput
    open_bucket = (tp.newest, list(tp._ops.items()), list(tp._tx.items()), list(tp._rx.items()))
    tp.flush()
    rings = [(k, list(r.stamp), list(r.tx), list(r.rx), list(r.ops)) for k, r in [("all", tp.total), *tp.ranks.items()]]
    return (list(f.edges.items()), sorted((e, list(b.items())) for e, b in f.buckets.items()), f.newest, f.evicted,
            open_bucket, rings)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("max_edges", [24, 1000])
def test_ring_ends_in_columns_leave_what_op_end_leaves(seed, max_edges, monkeypatch):
    """`Traffic.ring_ends` (the batch path's flows) against one `op_end` per end, in
    the same order: runs in one bucket, transfers over two, late ends, other
    patterns, zero bytes, slow calls between; an edge table that overflows, or one
    that keeps every edge in the order it first carried bytes."""
    import random

    import numpy as np

    monkeypatch.setattr(fl, "MAX_EDGES", max_edges)
    monkeypatch.setattr(fl, "RUN_MIN", 3)
    monkeypatch.setattr(fl, "RUN_WINDOW", 7 + seed * 50)  # runs cut by the window's edge too
    rng = random.Random(seed)
    groups = [list(range(8)), [6, 2, 9, 4], list(range(10, 40))]
    sigs = [("all_reduce", -1, 0), ("all_gather_into_tensor", -1, 1), ("broadcast", 2, 1), ("barrier", -1, 0),
            ("all_reduce", -1, 2), ("reduce_scatter_tensor", -1, 2)]
    rows, slow, t = [], [], T0
    for pos in range(1500):
        if rng.random() < 0.03:
            a, b = rng.sample(range(40), 2)
            slow.append((pos, (a, "send", 4096, t, t + MS), dict(failed=False, peer=b)))
            continue
        t += rng.choice([0, 1000, 50_000, 3 * MS])
        g = rng.randrange(len(sigs))
        op, root, gi = sigs[g]
        members = groups[gi]
        rank = rng.choice(members)
        nbytes = rng.choice([0, 1 << 20, 3000])
        t1 = t - rng.choice([0, 0, 0, 300 * MS])  # now and then a late one, from an older bucket
        t0 = t1 - rng.choice([1000, 2 * MS, 400 * MS])  # now and then over two buckets
        arrived = t0 + rng.choice([0, 500, 10 * MS])
        rows.append((pos, rank, nbytes, t0, t1, arrived, g))
    want = fl.Traffic()
    j = 0
    for pos, rank, nbytes, t0, t1, arrived, g in rows:
        while j < len(slow) and slow[j][0] < pos:
            want.op_end(*slow[j][1], **slow[j][2])
            j += 1
        op, root, gi = sigs[g]
        want.op_end(rank, op, nbytes, t0, t1, failed=False, root=root, members=groups[gi], arrived=arrived)
    for _, args, kw in slow[j:]:
        want.op_end(*args, **kw)

    # the columns the batch path hands over: a ring end's next member, bytes, start
    dst, v, start = [], [], []
    for pos, rank, nbytes, t0, t1, arrived, g in rows:
        op, root, gi = sigs[g]
        m = groups[gi]
        n = len(m)
        pat = fl.PATTERNS[op]
        ring = pat in (fl.RING_2, fl.RING_1) and nbytes > 0
        dst.append(m[(m.index(rank) + 1) % n] if ring else -1)
        v.append((2.0 * (n - 1) / n if pat == fl.RING_2 else (n - 1) / n) * nbytes if ring else 0.0)
        start.append(arrived if t0 < arrived < t1 else t0)
    col = lambda i: np.array([r[i] for r in rows], np.int64)  # noqa: E731
    ends = fl.RingEnds(col(0), col(1), col(2), col(3), col(4), col(5), np.array(dst, np.int64), np.array(v),
                       np.array(start, np.int64), col(6), [s[0] for s in sigs], [s[1] for s in sigs],
                       [groups[s[2]] for s in sigs])
    got = fl.Traffic()
    runs = []
    real = got._ring_run
    monkeypatch.setattr(got, "_ring_run", lambda e, lo, hi: runs.append(hi - lo) or real(e, lo, hi))
    got.ring_ends(ends, slow)
    assert _traffic_state(got) == _traffic_state(want)
    assert (want.flows.evicted > 0) == (max_edges < 100)
    assert len(runs) > 5  # runs went in columns

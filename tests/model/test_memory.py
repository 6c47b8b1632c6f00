"""What the model keeps per event stays bounded: a long run costs aggregates, not
a record per op."""

import random

import numpy as np
import pytest

from commviz.model import Model
from commviz.model.state import SeenIds
from tests.helpers import group, hello, op


def test_seen_ids_remember_every_started_op_in_constant_memory():
    s = SeenIds()
    for i in range(100_000):
        s.add(i)
    assert 99_999 in s and 0 in s and 100_000 not in s
    assert s.runs() == []  # consecutive ids collapse into the floor


def test_seen_ids_keep_gaps_open_as_runs():
    s = SeenIds()
    s.add(0)
    s.add(2)  # id 1 was dropped on the way
    assert 1 not in s and 2 in s
    s.add(1)  # …and comes back from the crash ring
    assert s.floor == 2 and s.runs() == []
    for i in range(100, 164):  # a frame of 64 ops after a lost one
        s.add(i)
    assert s.runs() == [(100, 163)] and 50 not in s and 120 in s


def test_seen_ids_stay_small_when_every_other_frame_is_lost():
    """Lost frames used to leave every later id in a set: 4 MB a rank at the cap,
    4 GB for a 1,024-rank job shedding for a few minutes."""
    s = SeenIds()
    for f in range(0, 20_000, 2):  # frames of 64 ids, every other one lost
        s.add_sorted(np.arange(64 * f, 64 * f + 64))
    assert len(s.runs()) <= SeenIds.SPAN // 128 + 1
    assert 64 * 19_998 in s and 64 * 19_997 not in s  # the newest gap is still open
    assert 64 * 1 in s  # gaps far below the top count as seen


@pytest.mark.parametrize("seed", range(6))
def test_seen_ids_end_the_same_in_any_order(seed, monkeypatch):
    """The batch path adds a rank's ids sorted; one event at a time they come in
    arrival order. Both must leave the same ids seen."""
    monkeypatch.setattr(SeenIds, "SPAN", 500)
    rng = random.Random(seed)
    ids = [i for i in range(3000) if rng.random() > 0.3]
    one, many = SeenIds(), SeenIds()
    shuffled = ids[:]
    for k in range(0, len(shuffled), 40):  # reordered a little, as frames arrive
        part = shuffled[k:k + 40]
        rng.shuffle(part)
        shuffled[k:k + 40] = part
    for i in shuffled:
        one.add(i)
    for k in range(0, len(ids), 200):
        part = ids[k:k + 200]
        for i in part[::7]:  # the per-event path took some of the batch's ops first
            many.add(i)
        many.add_sorted(np.array(part))
    assert (one.floor, one.runs(), one.top) == (many.floor, many.runs(), many.top)
    assert all((i in one) == (i in many) for i in range(3100))


def test_a_resent_start_is_not_counted_twice_however_old():
    m = Model()
    m.ingest(0, hello(0, world=1))
    m.ingest(0, group(ranks=(0,)))
    for i in range(70_000):
        for ev in op(i, 10 * i, 10 * i + 5, seq=i):
            m.ingest(0, ev)
    first = op(0, 0, 5)[0]
    m.ingest(0, first)  # the resync after a reconnect resends an old start
    assert m.duplicates == 1 and not m.ranks[0].inflight
    assert m.summary()["ops"][0]["count"] == 70_000


def _fed(n_ops: int) -> Model:
    m = Model()
    for r in (0, 1):
        m.ingest(r, hello(r))
        m.ingest(r, group())
    for i in range(n_ops):
        for r in (0, 1):
            for ev in op(i, 1000 * i + r, 1000 * i + 500, seq=i):
                m.ingest(r, ev)
    return m


def test_a_longer_run_costs_the_model_no_memory_per_op():
    import gc
    import tracemalloc

    sizes = []
    for n in (9_000, 19_000):  # both past the audit's window of 8,192 recent events a rank
        gc.collect()
        tracemalloc.start()
        m = _fed(n)
        gc.collect()
        sizes.append(tracemalloc.get_traced_memory()[0])
        tracemalloc.stop()
        assert m.summary()["ops"][0]["count"] == n
        del m
    # 20,000 more events: only the bounded latency reservoir grows (8 bytes a sample
    # plus the list), nothing per op id, instance or event
    assert sizes[1] - sizes[0] < 20_000 * 20, sizes

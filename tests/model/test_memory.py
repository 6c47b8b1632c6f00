"""What the model keeps per event stays bounded: a long run costs aggregates, not
a record per op."""

from commviz.model import Model
from commviz.model.state import SeenIds
from tests.helpers import group, hello, op


def test_seen_ids_remember_every_started_op_in_constant_memory():
    s = SeenIds()
    for i in range(100_000):
        s.add(i)
    assert 99_999 in s and 0 in s and 100_000 not in s
    assert s.above == set()  # consecutive ids collapse into the floor


def test_seen_ids_keep_gaps_open_and_bounded():
    s = SeenIds()
    s.add(0)
    s.add(2)  # id 1 was dropped on the way
    assert 1 not in s and 2 in s
    s.add(1)  # …and comes back from the crash ring
    assert s.floor == 2 and s.above == set()
    for i in range(10, 10 + 3 * SeenIds.MAX_ABOVE, 2):  # every other id lost
        s.add(i)
    assert len(s.above) <= SeenIds.MAX_ABOVE


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

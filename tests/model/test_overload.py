"""A watcher behind the job says how far, sheds detail past a bound, and keeps
counts and bytes exact while it does."""

from commviz.model import Model
from commviz.model.overload import Overload
from tests.helpers import group, hello, op

S = 1_000_000_000


def test_lag_is_now_minus_the_newest_event_and_shedding_has_hysteresis():
    o = Overload(shed_after_s=5.0)
    assert not o.update(10 * S, 9 * S) and o.lag_ns == S and o.words() == "lag 1.0 s"
    assert o.update(20 * S, 9 * S)  # 11 s behind
    assert "shedding detail" in o.words() and "counts and bytes stay exact" in o.words()
    assert o.update(20 * S, 16 * S)  # 4 s: still above half the bound
    assert not o.update(20 * S, 18 * S) and o.spells == 1


def feed(m: Model, shed_from: int | None, n: int = 200, shed_until: int | None = None):
    ranks = (0, 1, 2, 3)
    for r in ranks:
        m.ingest(r, hello(r, world=4))
        m.ingest(r, group(ranks=ranks))
    for i in range(n):
        if shed_from is not None and i == shed_from:
            m.shed = True
        if shed_until is not None and i == shed_until:
            m.shed = False
        for r in ranks:
            for ev in op(i, 1000 * i + r, 1000 * i + 500 + r, seq=i, nbytes=4096 * (1 + i % 3)):
                m.ingest(r, ev)
        m.ingest(0, op(10_000 + i, 1000 * i, 1000 * i + 90, name="isend", seq=i, peer=1)[0])
        m.ingest(0, op(10_000 + i, 1000 * i, 1000 * i + 90, name="isend", seq=i, peer=1)[1])
        m.ingest(1, op(10_000 + i, 1000 * i, 1000 * i + 95, name="irecv", seq=i, peer=0)[0])
        m.ingest(1, op(10_000 + i, 1000 * i, 1000 * i + 95, name="irecv", seq=i, peer=0)[1])
    return m


def counts(summary):
    return ([(o["op"], o["group"], o["count"], o["bytes"]) for o in summary["ops"]],
            summary["per_rank"], [r["status"] for r in summary["ranks"]])


def test_shedding_keeps_counts_and_bytes_exact_and_drops_detail():
    full = feed(Model(), None)
    shed = feed(Model(), shed_from=50)
    assert counts(shed.summary()) == counts(full.summary())
    assert shed.shed_ops == 150 and full.shed_ops == 0
    # detail stopped: latency saw only the first 50 steps' samples; flows went on as an
    # estimate (one end in 16, weighing 16), near what they are exactly
    shed.traffic.flush_sample()
    got, want = (sum(m.traffic.flows.total(0, 1)) for m in (shed, full))
    assert 0.5 * want < got < 1.5 * want
    assert shed.stats[("all_reduce", "0")].timed == 50 and full.stats[("all_reduce", "0")].timed == 200


def test_a_hang_is_still_found_while_shedding():
    m = feed(Model(hang_after_s=1.0), shed_from=0, n=10)
    for r in (0, 1, 2):  # rank 3 never comes to step 10
        m.ingest(r, op(10, 20_000, 0, seq=10)[0])
    [d] = m.findings(now=m.last_t + 5 * S).diagnoses
    assert d.kind.value == "hang" and d.missing_ranks == [3]


def test_frames_lost_on_the_way_shed_detail_until_a_quiet_spell():
    """Lost frames leave collectives holed: detail is shed at once, not only once the
    lag has grown, and kept shed until nothing has been lost for `quiet_s`."""
    o = Overload(shed_after_s=5.0, quiet_s=2.0)
    assert not o.update(10 * S, 10 * S, lost=0)
    assert o.update(11 * S, 8 * S, lost=3) and "3.0 s, frames lost: shedding" in o.words()
    assert o.update(12 * S, 12 * S, lost=3)  # 1 s since the last loss
    assert not o.update(14 * S, 14 * S, lost=3) and o.spells == 1
    assert o.update(15 * S, 15 * S, lost=4) and o.spells == 2


def test_a_spell_of_shedding_counts_each_collective_once_whatever_comes_late():
    """Shedding from the start, then back to detail: ranks' counts and the op table
    are those of a model that never shed."""
    full = feed(Model(), None)
    m = feed(Model(), shed_from=0, shed_until=120)
    assert counts(m.summary()) == counts(full.summary())
    assert m.stats[("all_reduce", "0")].timed == 80


def test_a_restarted_rank_after_a_spell_of_shedding_opens_instances_again():
    """A rank in a new process counts its seqs from 0 again, below what the spell
    counted: its collectives must still be tracked, or a hang there would go unseen."""
    m = feed(Model(hang_after_s=1.0), shed_from=0, n=10)
    m.shed = False
    m.ingest(3, hello(3, world=4, pid=999))  # rank 3 restarted
    for r in (0, 1, 2):
        m.ingest(r, hello(r, world=4, pid=900 + r))
    for r in (0, 1, 2):  # rank 3 never comes to the new step 0
        m.ingest(r, op(50, 30_000, 0, seq=0)[0])
    [d] = m.findings(now=m.last_t + 5 * S).diagnoses
    assert d.kind.value == "hang" and d.missing_ranks == [3] and d.seq == 0


def test_a_rank_restarted_during_a_spell_forgets_only_its_own_groups_counted_keys():
    m = feed(Model(), shed_from=0, n=10)
    m.ingest(0, group("solo", ranks=(0,)))
    for ev in op(500, 30_000, 30_500, gid="solo", seq=0):
        m.ingest(0, ev)
    assert m.counted("0", 5) and m.counted("solo", 0)
    m.ingest(1, hello(1, world=4, pid=999))  # rank 1 restarted: it is in "0", not in "solo"
    assert not m.counted("0", 5) and m.counted("solo", 0)


def test_keys_whose_every_frame_was_lost_do_not_hold_the_floor_back():
    """Every member has gone past a collective none of whose frames came: it can have
    no late member, so the counted keys' floor moves past it (else each such gap is
    held one by one for the rest of the spell)."""
    m = feed(Model(), None, n=0)
    m.shed = True
    ranks, events = [], []
    for i in range(80):
        if i % 4 == 3:
            continue  # every frame of this step was lost
        for r in (0, 1, 2, 3):
            for ev in op(i, 1000 * i + r, 1000 * i + 500 + r, seq=i):
                ranks.append(r)
                events.append(ev)
    m.ingest(ranks, events)
    assert m.retired["0"].floor == 78 and not m.retired["0"].above
    assert m.summary()["ops"][0]["count"] == 60


def test_a_watcher_counts_what_probes_left_out_from_its_first_word_with_them():
    """Counters.behind is the probe's total: what it left out before this watcher
    heard from it (for another watcher, now gone) is not this watcher's loss; a rank
    that restarts begins again from its own first word."""
    from commviz.events import Counters
    from commviz.model.state import Model
    from tests.helpers import hello

    m = Model()
    m.ingest(0, hello(0))
    m.ingest(0, Counters(1, behind=5000))  # a probe a slow watcher made trim, before this one
    assert m.behind_events == 0
    m.ingest(0, Counters(2, behind=5300))
    assert m.behind_events == 300
    m.ingest(1, hello(1))
    m.ingest(1, Counters(1, behind=0))
    m.ingest(1, Counters(2, behind=40))
    assert m.behind_events == 340
    m.ingest(0, Counters(3, behind=10))  # rank 0's process restarted: a new total
    m.ingest(0, Counters(4, behind=25))
    assert m.behind_events == 355

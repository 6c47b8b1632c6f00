"""The deferred path (probe/patch.py's wrapper, probe/derive.py on the probe's
thread; CPU, crash ring off): what the caller leaves raw still comes out exact —
an op in its call is visible before it returns, a queue at its cap drops whole ops
and counts them while later ops keep the sequence numbers torch's peers see, and
ops queued before a destroy_process_group stay on their group."""

import dataclasses
import threading

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from commviz import ops  # noqa: E402
from commviz.events import OpEnd, OpStart  # noqa: E402
from commviz.trace.file import load  # noqa: E402
from tests.probe.test_patch_fake_pg import WORLD, probe  # noqa: E402,F401  (the probe on the fake process group)


@pytest.fixture
def deferred(probe):
    """The probe with the crash ring off: the deferred path."""
    cfg = probe.cfg
    probe.shutdown()
    probe.cfg = dataclasses.replace(cfg, ring=False)
    probe.ensure_started()
    assert probe.deferred
    yield probe
    probe.shutdown()
    probe.cfg = cfg


def events(probe) -> list:
    return [e for b in load(probe.trace_path).batches for e in b.events]


def stopped_sender(probe):
    """Nothing drains the queue (the probe's thread stuck), samples off it."""
    s = probe.sender
    s._stop.set()
    s._wake.set()
    s.thread.join(5)
    if probe.sampler is not None:
        probe.sampler.stop()
    s.flush()
    return s


def test_an_op_in_its_call_is_in_flight_before_it_returns(deferred):
    from commviz.probe.patch import _wrap

    entered, release = threading.Event(), threading.Event()

    def blocking(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        entered.set()
        release.wait(30)

    wrapped = _wrap(blocking, ops.CATALOGUE["all_reduce"], deferred)
    s = stopped_sender(deferred)
    th = threading.Thread(target=wrapped, args=(torch.ones(3),))
    th.start()
    assert entered.wait(10)
    s.flush()  # while the call blocks: the watcher must see the op started
    [start] = [r for r in s.inflight.values()]
    assert (start[3], start[6]) == ("all_reduce", 12)
    release.set()
    th.join(10)
    s.flush()
    assert not s.inflight
    deferred.shutdown()
    evs = events(deferred)
    [st] = [e for e in evs if isinstance(e, OpStart)]
    [en] = [e for e in evs if isinstance(e, OpEnd)]
    assert st.id == en.id and en.t >= st.t and not en.error and st.shape == [3]


def test_a_full_queue_drops_whole_ops_counts_them_and_keeps_later_seqs(deferred):
    from commviz.probe.patch import _wrap

    def noop(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        return None

    probe = deferred
    dist.all_reduce(torch.ones(1))
    cfg = probe.cfg
    probe.cfg = dataclasses.replace(cfg, queue_cap=10)
    wrapped = _wrap(noop, ops.CATALOGUE["all_reduce"], probe)
    probe.cfg = cfg
    s = stopped_sender(probe)
    dropped = probe.health.dropped
    for _ in range(50):
        wrapped(torch.ones(4))
    # 10 ops queued, one Gap for the 40 others: their starts and ends counted as dropped
    assert len(probe.queue) == 11 and probe.health.dropped - dropped == 80
    s.flush()
    wrapped(torch.ones(4))
    s.flush()
    probe.shutdown()
    seqs = [e.seq for e in events(probe) if isinstance(e, OpStart)]
    # the first op's seq, the 10 queued, then the 51st: 40 numbers skipped, as torch's peers count them
    assert seqs[1:] == [seqs[0] + k for k in range(1, 11)] + [seqs[0] + 51]


def test_a_gap_on_a_sub_group_and_p2p_skips_only_their_numbers(deferred):
    from commviz.probe.patch import _wrap

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        return None

    def send(tensor, dst=None, group=None, tag=0, group_dst=None):
        return None

    from torch.testing._internal.distributed.fake_pg import FakeStore

    probe = deferred
    dist.destroy_process_group()  # fresh p2p counters
    dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
    g = dist.new_group([0, 1])
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    cfg = probe.cfg
    probe.cfg = dataclasses.replace(cfg, queue_cap=3)
    ar, sd = _wrap(all_reduce, ops.CATALOGUE["all_reduce"], probe), _wrap(send, ops.CATALOGUE["send"], probe)
    probe.cfg = cfg
    s = stopped_sender(probe)
    for _ in range(3):
        ar(t)  # fills the queue: default group seqs 0..2
    ar(t, group=g)  # dropped, as are the two sends: sub group seq 1, send→1 seqs 0 and 1
    sd(t, 1)
    sd(t, 1)
    dropped = probe.health.dropped
    sd(t, 2)  # dropped too, on its own peer
    assert probe.health.dropped - dropped == 2 and len(probe.queue) == 4
    s.flush()
    ar(t, group=g)
    sd(t, 1)
    sd(t, 2)
    s.flush()
    ar(t)
    s.flush()
    probe.shutdown()
    got = [(e.op, e.group != "0", e.peer, e.seq) for e in events(probe) if isinstance(e, OpStart)]
    base = got[-7][3]  # the first op that filled the queue, on the default group
    assert got[-7:] == [("all_reduce", False, -1, base), ("all_reduce", False, -1, base + 1),
                        ("all_reduce", False, -1, base + 2), ("all_reduce", True, -1, 2), ("send", False, 1, 2),
                        ("send", False, 2, 1), ("all_reduce", False, -1, base + 3)]


def test_ops_queued_before_a_destroy_stay_on_their_group(deferred):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    probe = deferred
    t = torch.ones(4)
    s = stopped_sender(probe)  # all below reaches the probe thread in one drain
    dist.all_reduce(t)
    dist.all_reduce(t)
    dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
    dist.all_reduce(t)
    s.flush()
    probe.shutdown()
    starts = [e for e in events(probe) if isinstance(e, OpStart)]
    assert [e.seq for e in starts][-3:] == [starts[-3].seq, starts[-3].seq + 1, 0]


def test_a_recv_and_async_ops_end_through_the_deferred_path(deferred):
    probe = deferred
    t = torch.ones(4)

    probe.shutdown()
    dist.all_reduce(t)  # starts the probe: what follows is deferred
    assert probe.deferred
    dist.recv(t, 3)  # returns the sender's rank
    dist.all_reduce(t, async_op=True).wait()
    dist.isend(t, 2).wait()
    probe.shutdown()
    evs = events(probe)
    ends = {e.id: e for e in evs if isinstance(e, OpEnd)}
    got = [(e.op, e.is_async, ends[e.id].error) for e in evs if isinstance(e, OpStart)]
    assert got[1:] == [("recv", False, ""), ("all_reduce", True, ""), ("isend", True, "")]
    recv = [e for e in evs if isinstance(e, OpStart) and e.op == "recv"][0]
    assert recv.peer == 3 and ends[recv.id].peer == 3


def test_runs_of_one_op_come_out_as_one_by_one(deferred):
    """Calls in a row that differ only in their tensor take probe/derive.py's run path
    (records built with zip); what comes out is what each call alone gives."""
    probe = deferred
    g = dist.new_group([0, 2])
    same, many = torch.ones(4), [torch.ones(k, 3) for k in range(1, 7)]

    def job():
        for _ in range(5):
            dist.all_reduce(same)  # one tensor: its fields read once
        for t in many:
            dist.all_reduce(t, group=g)  # six tensors, one keyword signature
        for _ in range(4):
            dist.send(same, 3)
        for t in many[:3]:
            dist.all_reduce(t, dist.ReduceOp.MAX)

    s = stopped_sender(probe)
    errors = probe.health.internal_errors
    job()
    s.flush()
    probe.shutdown()
    evs = events(probe)
    ends = {e.id: e for e in evs if isinstance(e, OpEnd)}
    starts = [e for e in evs if isinstance(e, OpStart)][-18:]
    assert probe.health.internal_errors == errors
    assert [s.id for s in starts] == list(range(starts[0].id, starts[0].id + 18))
    assert all(ends[s.id].t >= s.t and not ends[s.id].error for s in starts)
    base = starts[0].seq
    got = [(s.op, s.group != "0", s.seq, s.bytes, s.shape, s.peer, s.reduce_op) for s in starts]
    assert got == (
        [("all_reduce", False, base + k, 16, [4], -1, "SUM") for k in range(5)]
        + [("all_reduce", True, k, 12 * (k + 1), [k + 1, 3], -1, "SUM") for k in range(6)]
        + [("send", False, starts[11].seq + k, 16, [4], 3, "") for k in range(4)]
        + [("all_reduce", False, base + 5 + k, 12 * (k + 1), [k + 1, 3], -1, "MAX") for k in range(3)])

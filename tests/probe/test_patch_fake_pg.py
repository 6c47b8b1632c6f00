"""The probe on torch's `fake` process group (no communication): every wrapped call
is one event with exact bytes, peer/root, group and sequence number, and user code
never notices the patch."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.distributed.distributed_c10d as c10d  # noqa: E402

# torch binds these by name at import; imported here, before the probe patches
import torch.distributed.tensor._collective_utils as collective_utils  # noqa: E402

ORIGINAL_ISEND = c10d.isend  # captured before patching, as user code may do

from commviz.events import OpEnd, OpStart, events_in  # noqa: E402
from commviz.trace.file import load  # noqa: E402
from tests.probe.probing import WORLD, installed_probe, ops_of, stop_sender_thread  # noqa: E402,F401



@pytest.fixture(params=["ring on", "ring off"])
def ring(request, probe):
    """With the crash ring on, the caller's thread reads each tensor's bytes, dtype and
    shape; with it off (and CUDA not up) the probe's thread does, when it drains."""
    import dataclasses

    from torch.testing._internal.distributed.fake_pg import FakeStore

    cfg = probe.cfg
    probe.shutdown()
    probe.cfg = dataclasses.replace(cfg, ring=request.param == "ring on")
    dist.destroy_process_group()  # sequence numbers start afresh
    dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
    yield request.param
    probe.shutdown()
    probe.cfg = cfg


def test_both_namespaces_are_patched_with_one_wrapper(probe):
    for name in ("all_reduce", "send", "isend", "broadcast", "barrier", "all_gather_into_tensor"):
        assert getattr(dist, name) is getattr(c10d, name)
        assert getattr(dist, name)._commviz_original is not None


def test_instrument_is_idempotent(probe):
    from commviz.probe.patch import install

    before = dist.all_reduce
    assert install() is probe
    assert dist.all_reduce is before


def test_collectives_bytes_and_sequence(probe, ring):
    t = torch.ones(256)  # 1024 bytes

    def job():
        dist.all_reduce(t)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait()
        dist.broadcast(t, src=2)
        dist.barrier()
        dist.all_gather([torch.empty(256) for _ in range(WORLD)], t)
        dist.all_gather_into_tensor(torch.empty(256 * WORLD), t)
        dist.reduce_scatter_tensor(torch.empty(64), t)

    got = ops_of(probe, job)
    assert [(s.op, s.bytes, s.seq, s.group) for s, _ in got] == [
        ("all_reduce", 1024, 0, "0"),
        ("all_reduce", 1024, 1, "0"),
        ("broadcast", 1024, 2, "0"),
        ("barrier", 0, 3, "0"),
        ("all_gather", 4096, 4, "0"),
        ("all_gather_into_tensor", 4096, 5, "0"),  # one event, not two (it calls all_gather_single)
        ("reduce_scatter_tensor", 1024, 6, "0"),
    ]
    assert got[1][0].is_async and got[1][0].reduce_op == "MAX" and got[0][0].reduce_op == "SUM"
    assert got[2][0].root == 2
    assert all(e is not None and e.t >= s.t and not e.error for s, e in got)
    assert got[0][0].dtype == "float32" and got[0][0].shape == [256]


def test_a_sparse_tensor_is_its_indices_and_values(probe, ring):
    """torch's suite all-reduces sparse tensors, which have no `nbytes`: the op was
    lost (and an internal error printed in the job) until the bytes came from the
    tensor's parts, what gloo all-gathers."""
    t = torch.sparse_coo_tensor(torch.tensor([[0, 3]]), torch.ones(2, 5), (8, 5))  # 16 B indices, 40 B values
    errors = probe.health.internal_errors

    def job():
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()

    got = ops_of(probe, job)
    assert [(s.op, s.bytes, s.dtype, s.shape) for s, _ in got] == [("all_reduce", 56, "float32", [8, 5])] * 2
    assert probe.health.internal_errors == errors


def test_send_is_one_event_and_p2p_sequence_is_per_peer(probe, ring):
    t = torch.ones(100)

    def job():
        dist.send(t, 1)
        dist.send(t, 1)
        dist.isend(t, 2).wait()
        dist.recv(t, 3)

    got = ops_of(probe, job)
    assert [(s.op, s.peer, s.seq, s.bytes, s.is_async) for s, _ in got] == [
        ("send", 1, 0, 400, False),
        ("send", 1, 1, 400, False),
        ("isend", 2, 0, 400, True),
        ("recv", 3, 0, 400, False),
    ]


def test_object_collective_bytes_are_the_inner_calls(probe):
    payload = {"weights": list(range(100))}

    def job():
        dist.broadcast_object_list([payload], src=0)

    [(s, e)] = ops_of(probe, job)
    assert s.op == "broadcast_object_list" and s.root == 0
    # torch broadcasts the sizes (int64 per object) and then the pickled bytes
    import io
    import pickle

    f = io.BytesIO()
    pickle.Pickler(f).dump(payload)
    assert e.bytes == 8 + len(f.getvalue())


def test_sub_group_has_its_own_id_and_sequence(probe, ring):
    t = torch.ones(8)

    def job():
        g = dist.new_group([0, 1])
        dist.all_reduce(t, group=g)
        dist.all_reduce(t, group=g)
        dist.all_reduce(t)

    got = ops_of(probe, job)
    sub = [s for s, _ in got if s.group != "0"]
    assert [s.seq for s in sub] == [0, 1]
    assert [s.group for s, _ in got if s.group == "0"] == ["0"]


def test_users_exceptions_pass_through_unchanged(probe, ring):
    t = torch.ones(4)
    before = probe.health.internal_errors

    def job():
        with pytest.raises(ValueError):
            dist.all_reduce(t, group=123)  # torch rejects the group; so do we, quietly
        with pytest.raises(ValueError, match="should not be the same"):
            dist.send(t, 0)  # send to self

    got = ops_of(probe, job)
    assert probe.health.internal_errors == before
    [(s, e)] = got
    assert s.op == "send" and e.error.startswith("ValueError")


def test_commviz_off(monkeypatch):
    from commviz.probe.config import ProbeConfig

    monkeypatch.setenv("COMMVIZ", "0")
    assert not ProbeConfig.from_env().enabled


def test_names_bound_before_patching_are_rebound(probe):
    assert collective_utils.broadcast is dist.broadcast
    assert collective_utils.scatter is dist.scatter
    assert collective_utils.broadcast._commviz_original is not None


def test_p2pop_with_an_isend_captured_before_patching(probe):
    t = torch.ones(16)

    def job():
        op = dist.P2POp(ORIGINAL_ISEND, t, 1)
        assert op.op is dist.isend  # what batch_isend_irecv compares against
        for w in dist.batch_isend_irecv([op, dist.P2POp(dist.irecv, torch.empty(16), 3)]):
            w.wait()

    got = ops_of(probe, job)
    assert [(s.op, s.peer, s.bytes, s.batched) for s, _ in got] == [("isend", 1, 64, True), ("irecv", 3, 64, True)]
    assert all(e is not None for _, e in got)


def test_a_new_default_group_after_destroy_starts_its_sequence_afresh(probe):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    t = torch.ones(4)

    def job():
        dist.all_reduce(t)
        dist.destroy_process_group()
        dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
        dist.all_reduce(t)

    got = ops_of(probe, job)
    assert len(got) == 2 and got[1][0].seq == 0
    assert probe.default_group.pg is c10d._get_default_group()


def test_crash_ring_through_the_hot_path_keeps_the_last_1024_ops_and_their_ends(probe):
    from commviz.trace.ring import SLOTS, read_ring

    probe.shutdown()  # a fresh ring
    t = torch.ones(4)
    huge = torch.empty(0).as_strided((0,) + (70000,) * 59, (0,) * 60)  # 60 dims: a start over a slot's size
    for i in range(1_100):
        dist.all_reduce(huge if i == 1_050 else t)
    _, _, events = read_ring(probe.trace_path.parent / "rank-0.ring")
    probe.shutdown()
    starts = {e.id: e for e in events if isinstance(e, OpStart)}
    ends = {e.id: e for e in events if isinstance(e, OpEnd)}
    ids = sorted(starts)
    assert len(ids) == SLOTS and ids == list(range(ids[0], ids[0] + SLOTS)) and sorted(ends) == ids
    seqs = [starts[i].seq for i in ids]
    assert seqs == list(range(seqs[0], seqs[0] + SLOTS))
    big = starts[ids[1_050 - (1_100 - SLOTS)]]
    assert (big.bytes, big.shape) == (0, []) and all(starts[i].shape == [4] for i in ids if starts[i] is not big)
    assert all(ends[i].t >= starts[i].t for i in ids)


def test_an_op_torch_rejects_is_failed_in_the_crash_ring_too(probe):
    """The ring of a rank that died after an op failed says it failed (it said the op
    finished: its end was stamped like a success)."""
    from commviz.trace.ring import FAILED_IN_RING, read_ring

    probe.shutdown()  # a fresh ring
    t = torch.ones(4)
    dist.all_reduce(t)
    with pytest.raises(ValueError):
        dist.send(t, 0)  # to itself: torch's check raises inside the wrapped call
    events = read_ring(probe.trace_path.parent / "rank-0.ring")[2]  # both ends written on this thread
    probe.shutdown()
    ends = {e.id: e for e in events if isinstance(e, OpEnd)}
    first, second = sorted(ends)
    assert ends[first].error == "" and ends[second].error == FAILED_IN_RING


class _NoTruth(list):
    """A tensor list that fails if asked its truth value: for a one-element list of
    GPU tensors, that question reads the tensor and synchronizes the device."""

    def __bool__(self):
        raise AssertionError("the probe asked a tensor list for its truth value")


def test_tensor_lists_are_never_asked_their_truth_value(probe):
    t = torch.ones(4)
    errors = probe.health.internal_errors

    def job():
        dist.all_gather(_NoTruth([torch.empty(4) for _ in range(WORLD)]), t)
        dist.all_reduce_coalesced(_NoTruth([t]))

    got = ops_of(probe, job)
    assert [(s.op, s.bytes) for s, _ in got] == [("all_gather", 64), ("all_reduce_coalesced", 16)]
    assert probe.health.internal_errors == errors


def test_each_tensor_gets_its_own_bytes_and_shape_and_is_not_held_after_a_drain(probe, ring):
    import gc
    import weakref

    kept = []

    def job():
        for k in range(1, 40):
            t = torch.ones(k, 2)  # a new tensor each call, dropped by the caller at once
            kept.append(weakref.ref(t))
            dist.all_reduce(t, op=dist.ReduceOp.MAX if k % 2 else dist.ReduceOp.SUM)
            del t

    got = ops_of(probe, job)
    assert [(s.bytes, s.shape, s.dtype, s.reduce_op) for s, _ in got] == [
        (8 * k, [k, 2], "float32", "MAX" if k % 2 else "SUM") for k in range(1, 40)]
    gc.collect()
    assert all(r() is None for r in kept)
    assert probe.health.internal_errors == 0 or ring == "ring on"


def test_threads_calling_at_once_get_each_seq_exactly_once(probe, ring):
    import threading

    t = torch.ones(4)
    per_thread = 200

    def worker(out):
        for _ in range(per_thread):
            dist.all_reduce(t)
            out.append(threading.get_ident())

    def job():
        outs = [[] for _ in range(4)]
        threads = [threading.Thread(target=worker, args=(o,)) for o in outs]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    got = ops_of(probe, job)
    assert sorted(s.seq for s, _ in got) == list(range(4 * per_thread))
    assert all(e is not None and not e.error for _, e in got)


def test_a_stuck_probe_thread_bounds_the_queue_and_counts_every_dropped_record(probe):
    import dataclasses

    from commviz import ops
    from commviz.probe.patch import _wrap

    def noop(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        return None

    probe.shutdown()
    dist.all_reduce(torch.ones(1))  # starts the probe again
    cfg = probe.cfg
    probe.cfg = dataclasses.replace(cfg, queue_cap=10)
    wrapped = _wrap(noop, ops.CATALOGUE["all_reduce"], probe)
    probe.cfg = cfg
    s = probe.sender
    s._stop.set()
    s._wake.set()
    s.thread.join()
    if probe.sampler is not None:  # its own thread queues samples too: only ops counted here
        probe.sampler.stop()
    s.flush()
    dropped = probe.health.dropped
    for _ in range(50):
        wrapped(torch.ones(4))
    # 100 events: a start and an end an op, the end folded into its start where the
    # C wrapper took the call (events.py); each one kept or counted
    assert len(probe.queue) == 10 and events_in(list(probe.queue)) + probe.health.dropped - dropped == 100
    probe.shutdown()


def test_the_queue_holds_65536_records_and_counts_every_one_past_that(probe):
    stop_sender_thread(probe)
    t = torch.ones(4)
    before = probe.health.dropped
    n = 70_000  # a start and an end each: one record (folded, events.py) or two
    try:
        for _ in range(n):
            dist.all_reduce(t)
        assert probe.cfg.queue_cap == 65_536
        assert len(probe.queue) == 65_536
        assert events_in(list(probe.queue)) + probe.health.dropped - before == 2 * n
    finally:
        probe.queue.clear()
        probe.shutdown()


def test_a_stuck_sender_never_blocks_the_training_thread(probe):
    """The sender thread stuck in I/O (a disk that hangs): the caller's ops go on at
    their own pace, the queue stays at its cap, and the sender picks up afterwards."""
    import threading

    probe.shutdown()
    probe.ensure_started()
    s = probe.sender
    gate, stuck = threading.Event(), threading.Event()
    write = s.trace.write

    def hanging_write(payload):
        stuck.set()
        gate.wait(120)
        write(payload)

    s.trace.write = hanging_write
    t = torch.ones(4)
    dist.all_reduce(t)
    assert stuck.wait(10), "the sender never flushed"
    done = threading.Event()
    n = 100_000

    def train():
        for _ in range(n):
            dist.all_reduce(t)
        done.set()

    worker = threading.Thread(target=train, daemon=True)
    try:
        worker.start()
        # ~1 s on an idle box; a wrapper that waited on the sender never finishes, one
        # that slept even 1 ms per op would take 100 s
        assert done.wait(60), "the training thread was held up by the probe's I/O"
        assert len(probe.queue) <= probe.cfg.queue_cap
    finally:
        gate.set()
        worker.join(60)
    import time

    deadline = time.monotonic() + 30
    while probe.queue and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not probe.queue, "the sender never came back"
    dist.all_reduce(t)  # this op reaches the trace
    last = next(probe.ids) - 1
    probe.shutdown()
    ids = {e.id for b in load(probe.trace_path).batches for e in b.events if isinstance(e, OpEnd)}
    assert last in ids

"""The C wrapper (commviz/probe/_fastwrap.c) takes the common case of the fast
wrapper's calls; everything else goes to the Python wrapper it holds. Here: it is
built and used (a silent fall back to Python fails these tests), and it gives the
same events as the Python wrapper on torch's `fake` backend, call for call."""

import dataclasses
import inspect

import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.native
import torch.distributed as dist  # noqa: E402
import torch.distributed.distributed_c10d as c10d  # noqa: E402

from commviz import ops  # noqa: E402
from tests.probe.probing import installed_probe, ops_of, stop_sender_thread  # noqa: E402

WORLD = 4
FAST_OPS = ("all_reduce", "send", "recv", "isend", "irecv", "all_gather_into_tensor", "reduce_scatter_tensor",
            "all_to_all_single")


def fresh_world():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()  # sequence numbers start afresh
    dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """The probe with the crash ring off (`ring_on` turns it on)."""
    with installed_probe(tmp_path_factory) as p:
        cfg = p.cfg
        p.shutdown()
        p.cfg = dataclasses.replace(cfg, ring=False)
        fresh_world()
        yield p
        p.shutdown()
        p.cfg = cfg
        dist.destroy_process_group()


def events_of(probe, fn):
    """Run fn on a fresh default group, flush, return [(OpStart, OpEnd|None)]."""
    return ops_of(probe, lambda: (fresh_world(), fn()))


def comparable(got):
    """What must be equal between the two wrappers: all but times; ids relative to
    the first; groups as default or not (a sub-group's name counts up per process)."""
    first = got[0][0].id if got else 0
    out = []
    for s, e in got:
        out.append((s.id - first, s.op, s.seq, s.bytes, s.dtype, list(s.shape), s.peer, s.root, s.is_async,
                    s.reduce_op, s.group == "0", s.batched,
                    None if e is None else (e.error, e.bytes, e.peer, e.t >= s.t)))
    return out


def c_wrapper(name):
    """The C wrapper behind `dist.<name>`: reached through a Python shim dynamo can
    see through (probe/transparent.py)."""
    w = getattr(getattr(dist, name), "_commviz_fast", None)
    assert type(w).__name__ == "FastWrapper", f"{name}: the C wrapper is not used ({type(w)})"
    return w


def test_the_c_wrapper_is_built_and_wraps_the_fast_ops(probe):
    from commviz.probe import _fastwrap  # not built: this fails, it is not skipped

    for name in FAST_OPS:
        w = c_wrapper(name)
        assert isinstance(w, _fastwrap.FastWrapper)
        front = getattr(c10d, name)
        assert getattr(dist, name) is front and front._commviz_fast is w
        orig = front._commviz_original
        assert front._torchdynamo_inline is orig
        assert inspect.unwrap(front) is inspect.unwrap(orig)  # (transparent.look_like)
        assert front.__name__ == orig.__name__ and front.__doc__ == orig.__doc__
        assert front.__module__ == orig.__module__ and front.__qualname__ == orig.__qualname__
        assert front.__code__ in probe.wrapper_codes and w._commviz_slow.__code__ in probe.wrapper_codes
    # the generic ones stay in Python
    assert type(dist.broadcast).__name__ == "function"


def test_the_common_case_is_taken_in_c(probe):
    t, out = torch.ones(8), torch.empty(8 * WORLD)
    names = ("all_reduce", "send", "recv", "isend", "irecv", "all_gather_into_tensor")
    before = {n: (c_wrapper(n).fast_calls, c_wrapper(n).slow_calls) for n in names}
    nested = {n: c_wrapper(n).nested_calls for n in names}

    def job():
        dist.all_reduce(t)  # the probe is not started yet: Python starts it
        dist.all_reduce(t)
        dist.send(t, 1)
        dist.recv(t, 2)
        dist.isend(t, 1).wait()
        dist.irecv(t, 3).wait()
        dist.all_gather_into_tensor(out, t)

    events_of(probe, job)
    fast = {n: c_wrapper(n).fast_calls - before[n][0] for n in names}
    slow = {n: c_wrapper(n).slow_calls - before[n][1] for n in names}
    assert fast == {"all_reduce": 1, "send": 1, "recv": 1, "isend": 1, "irecv": 1, "all_gather_into_tensor": 1}
    assert slow == {"all_reduce": 1, "send": 0, "recv": 0, "isend": 0, "irecv": 0, "all_gather_into_tensor": 0}
    # send and recv call isend and irecv inside: not events, passed straight to torch
    assert c_wrapper("isend").nested_calls - nested["isend"] == 1
    assert c_wrapper("irecv").nested_calls - nested["irecv"] == 1


def test_it_binds_like_a_function():
    class Holder:
        f = dist.all_reduce

    h = Holder()
    bound = h.f
    assert bound.__self__ is h and bound.__func__ is dist.all_reduce
    assert Holder.f is dist.all_reduce

    assert list(inspect.signature(dist.all_reduce).parameters) == list(
        inspect.signature(dist.all_reduce._commviz_original).parameters)


def run_both(probe, job):
    """job(w) with w(name) the C wrapper, then with the Python one it holds."""
    def fast_calls():
        return sum(c_wrapper(n).fast_calls for n in FAST_OPS)

    n0 = fast_calls()
    c = events_of(probe, lambda: job(c_wrapper))
    n1 = fast_calls()
    py = events_of(probe, lambda: job(lambda name: c_wrapper(name)._commviz_slow))
    assert n1 > n0 and fast_calls() == n1  # the first run took calls in C, the second none
    assert c and comparable(c) == comparable(py)
    return c


def test_same_events_as_python_positional_keyword_groups_and_async(probe):
    t, out, small = torch.ones(16), torch.empty(16 * WORLD), torch.empty(4)

    def job(w):
        sub = dist.new_group([0, 1])
        w("all_reduce")(t)
        w("all_reduce")(t)
        w("all_reduce")(t, dist.ReduceOp.SUM)
        w("all_reduce")(t, dist.ReduceOp.MAX)  # not the default op: Python
        w("all_reduce")(t, op=dist.ReduceOp.MIN, async_op=True).wait()  # keywords: Python
        w("all_reduce")(t, dist.ReduceOp.SUM, None, True).wait()  # async, by position
        w("all_reduce")(t, dist.ReduceOp.SUM, sub)
        w("all_reduce")(t, group=sub)
        w("all_reduce")(t, dist.ReduceOp.SUM, sub, 0)
        w("send")(t, 1)
        w("send")(t, 1)
        w("send")(t, dst=2)
        w("send")(t, 1, sub)
        w("recv")(t, 3)
        w("recv")(t, src=3)
        w("isend")(t, 2).wait()
        w("isend")(tensor=t, dst=2).wait()
        w("irecv")(t, 1).wait()
        w("irecv")(t, 1, sub).wait()
        w("all_gather_into_tensor")(out, t)
        w("all_gather_into_tensor")(out, t, None, True).wait()
        w("all_gather_into_tensor")(output_tensor=out, input_tensor=t)
        w("all_gather_into_tensor")(torch.empty(32), t, sub)
        w("reduce_scatter_tensor")(small, t)
        w("all_to_all_single")(torch.empty(16), t)

    got = run_both(probe, job)
    assert [s.op for s, _ in got].count("all_reduce") == 9
    assert all(e is not None and not e.error for _, e in got)


def test_same_events_as_python_nested_and_coalesced(probe):
    t = torch.ones(16)

    def job(w):
        # object collectives call the tensor ones inside: those are not events, and
        # their bytes are the outer call's
        dist.send_object_list([{"a": list(range(50))}], 1)
        dist.broadcast_object_list([{"a": 1}], src=0)
        with c10d._coalescing_manager():
            w("all_reduce")(t)
            w("all_reduce")(t)
        w("all_reduce")(t)

    got = run_both(probe, job)
    assert [s.op for s, _ in got] == ["send_object_list", "broadcast_object_list", "all_reduce", "all_reduce",
                                      "all_reduce"]
    assert got[0][1].bytes > 8


class Boom(Exception):
    pass


def test_same_events_as_python_when_torch_raises_and_the_exception_is_unchanged(probe):
    from commviz.probe.patch import _wrap

    raised = []

    def raising(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        exc = Boom("no")
        raised.append(exc)
        raise exc

    wrapped = _wrap(raising, ops.CATALOGUE["all_reduce"], probe)
    wrapped = wrapped._commviz_fast  # the C wrapper behind its shim (probe/transparent.py)
    assert type(wrapped).__name__ == "FastWrapper"
    t = torch.ones(4)
    before = probe.health.internal_errors

    def job(w):
        f = wrapped if w is c_wrapper else wrapped._commviz_slow
        for _ in range(2):
            with pytest.raises(Boom) as info:
                f(t)
            assert info.value is raised[-1]
            assert info.traceback[-1].name == "raising"  # its traceback goes on to torch's frame
        for _ in range(2):
            with pytest.raises(ValueError, match="should not be the same"):
                w("send")(t, 0)  # send to self: torch's check
        with pytest.raises((ValueError, AttributeError)):
            w("all_reduce")(t, dist.ReduceOp.SUM, 123)  # a bad group: torch's error, not an event
        with pytest.raises(ValueError):
            w("all_reduce")(t, group=123)

    fast = wrapped.fast_calls
    got = run_both(probe, job)
    assert wrapped.fast_calls > fast
    assert probe.health.internal_errors == before
    assert [(s.op, e.error.split(":")[0]) for s, e in got] == [("all_reduce", "Boom"), ("all_reduce", "Boom"),
                                                                ("send", "ValueError"), ("send", "ValueError")]
    # depth went back to 0: the next call is an event again
    assert len(events_of(probe, lambda: dist.all_reduce(t))) == 1


def test_a_full_queue_counts_every_dropped_event_as_python_does(probe):
    from commviz.events import events_in, unfold
    from commviz.probe.patch import _wrap

    def noop(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        return None

    cfg = probe.cfg
    probe.cfg = dataclasses.replace(cfg, queue_cap=10)
    wrapped = _wrap(noop, ops.CATALOGUE["all_reduce"], probe)
    probe.cfg = cfg
    wrapped = wrapped._commviz_fast  # the C wrapper behind its shim (probe/transparent.py)
    assert type(wrapped).__name__ == "FastWrapper"
    t = torch.ones(4)
    kept = {}
    try:
        for f in (wrapped, wrapped._commviz_slow):
            stop_sender_thread(probe)
            f(t)  # this thread's state made
            probe.queue.clear()
            fast, dropped = wrapped.fast_calls, probe.health.dropped
            for _ in range(50):
                f(t)
            # every event is kept or counted: Python queues two records an op, C one
            # (a blocking op's end folded into its start, events.py)
            queued = list(probe.queue)
            assert len(queued) == 10 and events_in(queued) + probe.health.dropped - dropped == 100
            kept[f is wrapped] = [(r[0], r[3] if r[0] == "start" else None) for r in unfold(queued)]
            if f is wrapped:
                assert wrapped.fast_calls - fast == 50
    finally:
        probe.queue.clear()
        probe.shutdown()
    assert len(kept[True]) == 20 and kept[True][:10] == kept[False]


def test_it_sees_the_probe_and_cuda_change_between_calls(probe, monkeypatch):
    """The C wrapper keeps what it read of the probe and of torch.cuda while their
    dicts are unchanged (their version tags say so): a change between two calls —
    CUDA coming up, the default group replaced, the crash ring on, the probe
    stopped — is seen by the next call."""
    from commviz.events import unfold
    from commviz.probe.core import GroupInfo, _no_ring_end
    from commviz.probe.patch import _wrap

    def noop(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        return None

    wrapped = _wrap(noop, ops.CATALOGUE["all_reduce"], probe)
    wrapped = wrapped._commviz_fast  # the C wrapper behind its shim (probe/transparent.py)
    assert type(wrapped).__name__ == "FastWrapper"
    t = torch.ones(4)
    stop_sender_thread(probe)
    wrapped(t)  # this thread's state, the default group

    def taken():
        fast = wrapped.fast_calls
        wrapped(t)
        return wrapped.fast_calls - fast == 1

    assert taken() and taken()
    monkeypatch.setattr(torch.cuda, "_initialized", True)
    assert not taken()  # CUDA up: Python's path (events on the device's clock)
    monkeypatch.setattr(torch.cuda, "_initialized", False)
    assert taken()

    g = probe.default_group
    other = GroupInfo(g.pg, "other", g.ranks, g.backend)
    probe.default_group = other
    try:
        assert taken()
        # (the queue may hold a GroupDef too, where no earlier test here announced the group)
        starts = [r for r in unfold(list(probe.queue)) if isinstance(r, (list, tuple)) and r[0] == "start"]
        assert starts[-1][4] == "other"  # the new group's
        assert other.seq == 1
    finally:
        probe.default_group = g

    seen = []
    probe.ring_start = lambda op_id, start: seen.append(op_id)
    probe.ring_end = lambda op_id, t1: seen.append(-op_id)
    try:
        assert taken()
        assert len(seen) == 2 and seen[0] == -seen[1]
    finally:
        probe.ring_start, probe.ring_end = None, _no_ring_end
    assert taken() and len(seen) == 2

    probe.started = False
    try:
        assert not taken()
    finally:
        probe.started = True
    probe.queue.clear()
    probe.shutdown()


def test_a_blocking_ops_end_is_folded_into_its_start_unless_a_drain_took_it(probe):
    """One record per blocking op taken in C: its end's time is folded into its start
    while the start is the queue's last record (events.py, FOLDED). A start drained
    while the op runs (an op that hangs, or a slow one) is in flight on the sender, and
    its end comes as its own record, as does an end with other records queued after
    its start. On the wire both are the same two events, in frames of at most
    MAX_BATCH events."""
    from commviz.events import END, FOLDED, START, START_LEN, unfold
    from commviz.probe import sender as sender_mod
    from commviz.probe.patch import _wrap
    from commviz.trace.file import load

    sender = None

    def op(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        return None

    def drained_while_it_runs(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        sender._drain()

    quick, slow = (_wrap(f, ops.CATALOGUE["all_reduce"], probe) for f in (op, drained_while_it_runs))
    t = torch.ones(4)
    sender = stop_sender_thread(probe)
    quick(t)  # this thread's state, the default group: Python
    probe.queue.clear()
    quick(t)
    quick(t)
    q = list(probe.queue)
    assert [(r[0], len(r)) for r in q] == [(FOLDED, START_LEN + 1)] * 2
    assert [r[0] for r in unfold(q)] == [START, END, START, END] and unfold(q)[1][1] == q[0][1]
    assert unfold(q)[1][2] >= q[0][2]  # the end's time after the start's
    probe.queue.clear()

    slow(t)
    q = list(probe.queue)
    assert len(q) == 1 and q[0][0] == END and q[0][1] in sender.inflight  # its start went in flight
    sender._drain()
    assert not sender.inflight

    # another thread's record queued while the op ran: the end stays after it, in time order
    other = ("another thread's record",)
    busy = _wrap(lambda tensor, op=None, group=None, async_op=False: probe.queue.append(other),
                 ops.CATALOGUE["all_reduce"], probe)
    busy(t)
    assert [r[0] for r in probe.queue] == [START, other[0], END]
    probe.queue.clear()

    # the sender took the queue (its drain not yet run) and as many records came after:
    # the queue's length is what it was, but the start is the sender's, not folded into
    from commviz.probe._fastwrap import take

    taken = []

    def taken_and_refilled(tensor, op=None, group=None, async_op=False):
        taken.extend(take(probe.queue))
        probe.queue.append(other)

    _wrap(taken_and_refilled, ops.CATALOGUE["all_reduce"], probe)(t)
    assert [r[0] for r in taken] == [START] and [r[0] for r in probe.queue] == [other[0], END]
    probe.queue.clear()
    probe.shutdown()
    sender = stop_sender_thread(probe)
    n = sender_mod.MAX_BATCH + 700
    for _ in range(n):
        quick(t)
    assert len(probe.queue) == n
    sender.flush()
    probe.shutdown()
    frames = [[e for e in b.events if type(e).__name__ in ("OpStart", "OpEnd")] for b in load(probe.trace_path).batches]
    assert sum(len(f) for f in frames) == 2 * n and max(len(f) for f in frames) <= sender_mod.MAX_BATCH
    ids = [e.id for f in frames for e in f]
    assert ids == [i for i in ids[::2] for _ in (0, 1)]  # each start with its end, never cut apart


def test_hang_stacks_find_a_thread_inside_a_call_taken_in_c(probe):
    """A call the C wrapper took leaves only its shim's frame on the stack: the
    thread is found by it (and by torch's function's code), and the stack shown
    starts at the user's line."""
    import threading

    from commviz.probe import stacks
    from commviz.probe.patch import _wrap

    block, inside, release = threading.Event(), threading.Event(), threading.Event()

    def blocking(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if block.is_set():
            inside.set()
            release.wait(10)

    front = _wrap(blocking, ops.CATALOGUE["all_reduce"], probe)
    wrapped = front._commviz_fast
    probe.ensure_started()

    def user_code():
        front(torch.ones(2))  # a new thread's first call: Python makes its state
        block.set()
        front(torch.ones(2))  # the user's line, in C

    th = threading.Thread(target=user_code, name="trainer")
    fast = wrapped.fast_calls
    th.start()
    try:
        assert inside.wait(5)
        assert wrapped.fast_calls - fast == 1
        assert [n for n, _ in stacks.threads_inside(probe.wrapper_codes)] == ["trainer"]  # the shim's frame
        assert not stacks.threads_inside({wrapped._commviz_slow.__code__})  # the Python wrapper's is not
        assert [n for n, _ in stacks.threads_inside(probe.wrapper_codes | probe.find_codes)] == ["trainer"]
        stack = probe.capture_stack(0)
        assert stack is not None and stack.thread == "trainer"
        funcs = [f.function for f in stack.frames]
        assert "user_code" in funcs and funcs.index("user_code") < funcs.index("blocking")
    finally:
        release.set()
        th.join(5)


def test_it_pickles_and_copies_by_name_as_a_function_does(probe):
    import copy
    import pickle

    w = dist.all_reduce
    assert pickle.loads(pickle.dumps(w)) is w
    assert copy.deepcopy(w) is w and copy.copy(w) is w


@pytest.fixture
def ring_on(probe):
    """The crash ring on (the default with a trace dir): `read()` gives what it holds
    now, as `commviz summary` recovers it from a rank that died."""
    from commviz.trace.ring import read_ring

    cfg = probe.cfg
    probe.shutdown()
    probe.cfg = dataclasses.replace(cfg, ring=True)

    def read():
        return read_ring(probe.ring.path)[2]

    yield read
    probe.shutdown()
    probe.cfg = cfg


def test_with_the_crash_ring_on_calls_are_taken_in_c_with_the_same_events_and_ring(probe, ring_on):
    t, out = torch.ones(16), torch.empty(16 * WORLD)
    rings = {}

    def job(w):
        probe.ensure_started()
        w("all_reduce")(t)
        w("all_reduce")(t)
        w("all_reduce")(t.half())
        w("send")(t, 1)
        w("isend")(t, 2).wait()  # not blocking: its end reaches the ring through the probe
        w("all_gather_into_tensor")(out, t)
        w("all_reduce")(torch.ones(2, 3, dtype=torch.int64))
        rings[w is c_wrapper] = ring_on()

    def ring_view(events):
        """Starts, and the ends of the blocking ops (the isend's end reaches the ring
        from the probe's thread, whenever it sees the work done)."""
        first = events[0].id
        asynchronous = {e.id for e in events if type(e).__name__ == "OpStart" and e.is_async}
        return [(type(e).__name__, e.id - first) + ((e.op, e.seq, e.bytes, e.dtype, list(e.shape), e.peer,
                                                      e.is_async, e.reduce_op) if type(e).__name__ == "OpStart"
                                                     else (e.t > 0,))
                for e in events if type(e).__name__ == "OpStart" or e.id not in asynchronous]

    from commviz.probe.names import dtype_name

    for dt in (torch.float16, torch.int64):
        dtype_name(dt)  # a dtype's first call names it, in Python; C reads the names it has
    before = {n: c_wrapper(n).fast_calls for n in FAST_OPS}
    got = run_both(probe, job)
    taken = {n: c_wrapper(n).fast_calls - before[n] for n in FAST_OPS}
    # all but the first all_reduce: on a fresh world Python learns the default group
    assert taken["all_reduce"] == 3 and taken["send"] == 1 and taken["isend"] == 1
    assert [(s.op, s.dtype, list(s.shape)) for s, _ in got][:3] == [
        ("all_reduce", "float32", [16]), ("all_reduce", "float32", [16]), ("all_reduce", "float16", [16])]
    assert ring_view(rings[True]) == ring_view(rings[False])
    starts = [e for e in rings[True] if type(e).__name__ == "OpStart"]
    assert [e.op for e in starts] == ["all_reduce"] * 3 + ["send", "isend", "all_gather_into_tensor", "all_reduce"]
    assert sum(type(e).__name__ == "OpEnd" for e in rings[True]) >= 6  # the blocking ones, written from C


def test_with_the_ring_on_a_tensor_field_redefined_on_tensor_is_read_as_python_reads_it(probe, ring_on,
                                                                                       monkeypatch):
    """The C wrapper calls torch's getters for the ring's tensor reads itself, while
    torch.Tensor is as it was when it found them: a field redefined on the class is
    read through the new definition, as Python would read it."""
    t = torch.ones(16)
    probe.ensure_started()
    w = c_wrapper("all_reduce")
    w(t)  # Python: this thread's state, the group
    fast = w.fast_calls
    w(t)
    monkeypatch.setattr(torch.Tensor, "nbytes", property(lambda self: 12_345), raising=True)
    w(t)
    monkeypatch.undo()
    w(t)
    assert w.fast_calls - fast == 3
    starts = [e for e in ring_on() if type(e).__name__ == "OpStart"]
    assert [e.bytes for e in starts[-3:]] == [64, 12_345, 64]


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="3.13 gives torch.Tensor no valid type version tag, so the C "
                    "wrapper does not trust torch's getters and reads each op's tensor afresh (its true size)")
def test_with_the_ring_on_a_tensors_fields_are_read_once_per_drain_and_it_is_let_go_by_the_next(probe, ring_on):
    """The C wrapper keeps its reads of a tensor's fields for the ring until the next
    drain, as the drain reads a deferred start's once per batch: a tensor resized in
    place between two ops of one flush interval is named by its first reading, and
    read again after a drain. It holds the tensor no longer than that."""
    import weakref

    stop_sender_thread(probe)  # drains come only from here
    w = c_wrapper("all_reduce")
    t = torch.ones(16)
    w(t)  # Python: this thread's state, the group
    probe.sender._drain()
    fast = w.fast_calls
    w(t)
    t.resize_(32)
    w(t)  # read before the resize, no drain since
    probe.sender._drain()
    w(t)
    assert w.fast_calls - fast == 3
    starts = [e for e in ring_on() if type(e).__name__ == "OpStart"]
    assert [e.bytes for e in starts[-3:]] == [64, 64, 128]
    assert [list(e.shape) for e in starts[-3:]] == [[16], [16], [32]]

    gone = torch.ones(8)
    held = weakref.ref(gone)
    probe.sender._drain()  # the entries let go: this tensor's slot is free whatever its address
    w(gone)
    del gone
    assert held() is not None  # read for the ring, kept until a drain
    probe.sender._drain()
    assert held() is None


def test_a_failing_ring_is_the_probes_error_and_ctrl_c_in_it_goes_up_unrun(probe, ring_on):
    """Both wrappers: a ring writer that raises an Exception is counted as the probe's
    internal error and the op is recorded and run all the same; a KeyboardInterrupt
    raised in it reaches the user and torch's function is not called."""
    from commviz.probe.patch import _wrap

    calls = []

    def op(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        calls.append(1)

    from commviz.events import unfold

    wrapped = _wrap(op, ops.CATALOGUE["all_reduce"], probe)
    wrapped = wrapped._commviz_fast  # the C wrapper behind its shim (probe/transparent.py)
    assert type(wrapped).__name__ == "FastWrapper"
    t = torch.ones(4)
    stop_sender_thread(probe)  # nothing drains the queue while we read it
    wrapped(t)  # this thread's state and the group, in Python
    counted = probe.health.internal_errors  # put back after: other modules' tests read the total
    for f in (wrapped, wrapped._commviz_slow):
        good = probe.ring_start
        try:
            def broken(op_id, start):
                raise OSError("disk gone")

            probe.ring_start = broken
            errors, n, fast = probe.health.internal_errors, len(calls), wrapped.fast_calls
            f(t)
            assert len(calls) == n + 1 and probe.health.internal_errors == errors + 1
            assert (wrapped.fast_calls - fast) == (1 if f is wrapped else 0)
            assert [r[0] for r in unfold(list(probe.queue))[-2:]] == ["start", "end"]  # recorded

            def interrupted(op_id, start):
                raise KeyboardInterrupt

            probe.ring_start = interrupted
            with pytest.raises(KeyboardInterrupt):
                f(t)
            assert len(calls) == n + 1 and probe.health.internal_errors == errors + 1
        finally:
            probe.ring_start = good
        from commviz.probe.core import DEPTH, thread_state

        assert thread_state(probe.tls)[DEPTH] == 0  # the next call is an event again
    probe.health.internal_errors = counted

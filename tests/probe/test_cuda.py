"""The NCCL path before it meets a GPU (issue 17), one test per fault, against a fake
`torch.cuda` (tests/probe/fake_cuda.py) that fails any CUDA call made on a thread
whose current device is not the one the call is about.

The probe is the real one, installed on torch's `fake` process group; the wrapped
ops are fakes with the signature of torch's, so the probe wraps them exactly as it
wraps torch's and they can return the Work a real NCCL op would."""

import functools
import threading
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.distributed_c10d as c10d  # noqa: E402

from commviz import ops as opcat  # noqa: E402
from commviz.events import Hello, OpEnd, OpStart  # noqa: E402
from commviz.trace.file import load  # noqa: E402
from tests.probe.fake_cuda import FakeCuda, FakeTensor, FakeWork, Props, Stream  # noqa: E402

WORLD = 4


@pytest.fixture
def fc(monkeypatch):
    """torch.cuda, as the probe sees it, is the fake: 4 GPUs, this thread on GPU 0;
    the driver's capture-mode call is the fake's (a GPU machine has libcuda)."""
    from commviz.probe import cuda as probe_cuda

    fc = FakeCuda(4)
    monkeypatch.setattr(probe_cuda, "driver_capture_mode", lambda: fc.exchange_capture_mode)
    for name in ("Event", "current_stream", "current_device", "set_device", "device", "stream",
                 "is_current_stream_capturing", "get_device_properties", "is_available"):
        monkeypatch.setattr(torch.cuda, name, getattr(fc, name))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("the probe synchronized the device"))
    monkeypatch.setattr(torch.cuda, "_initialized", True)
    monkeypatch.setattr(torch.cuda, "stream_key", fc.stream_key, raising=False)  # torch._C._cuda_getCurrentStream
    # torch.cuda.CUDAGraph as the probe sees it: capture_begin/capture_end, as torch's
    # (a Python class of our own: the C++ base cannot be made without a GPU on a CUDA build)
    class FakeGraph:
        def __init__(self, keep_graph=False):
            pass

        def capture_begin(self, pool=None, capture_error_mode="global"):
            fc.graph_begin(self, pool, capture_error_mode)

        def capture_end(self):
            fc.graph_end(self)

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    from commviz.probe import patch

    side = patch._probe.cuda_side if patch._probe is not None else None
    if side is not None:  # the probe patched the real class at its start: it counts captures of this one too
        side.patch_graphs([])
    return fc


def fake_op(probe, name, result=None, during=None):
    """torch's `name`, wrapped by the probe, doing nothing but `during(tensor)` and
    returning `result()` (a Work for async calls)."""
    from commviz.probe.patch import _wrap

    real = getattr(c10d, name)
    real = getattr(real, "_commviz_original", real)

    @functools.wraps(real)
    def op(*args, **kwargs):
        if during is not None:
            during(args[0] if args else next(iter(kwargs.values())))
        return result() if result is not None else None

    return _wrap(op, opcat.CATALOGUE[name], probe)


def recorded(probe, fn):
    """Run fn with the probe writing a fresh trace; the trace's events after it."""
    probe.shutdown()
    fn()
    probe.shutdown()  # ops still completing get the probe's exit grace to land
    return [e for b in load(probe.trace_path).batches for e in b.events]


def ops_of(probe, fn):
    evs = recorded(probe, fn)
    ends = {e.id: e for e in evs if isinstance(e, OpEnd)}
    return [(s, ends.get(s.id)) for s in evs if isinstance(s, OpStart)]


# 1 -------------------------------------------------------------------------------


def test_1_no_cuda_call_on_a_probe_thread_without_the_events_device_set(probe, fc):
    """The user's thread is on GPU 2; the probe's threads start on GPU 0. Every query
    of an event or a Work on GPU 2 must happen with GPU 2 set on the querying thread."""
    x = FakeTensor(2)
    work = FakeWork(fc, 2)

    def job():
        fc.set_device(2)
        fake_op(probe, "all_reduce")(x)
        fake_op(probe, "all_reduce", result=lambda: work)(x, async_op=True)
        assert fc.queried.wait(5)  # the probe's thread asks while the ops are in flight
        fc.default[2].run(5.0)
        work.finish(9.0)

    got = ops_of(probe, job)
    assert fc.violations == []
    assert [(s.op, e is not None and e.error) for s, e in got] == [("all_reduce", ""), ("all_reduce", "")]


# 2 -------------------------------------------------------------------------------


def test_2_an_op_on_a_capturing_stream_is_reported_captured_and_records_no_event(probe, fc):
    x = FakeTensor(0)

    def job():
        g = torch.cuda.CUDAGraph()
        with fc.stream(Stream(fc, 0)):
            g.capture_begin(capture_error_mode="thread_local")
            fake_op(probe, "all_reduce")(x)
            g.capture_end()

    [(s, e)] = ops_of(probe, job)
    assert e is not None and e.error == "" and e.captured  # it runs at each replay, not now
    assert e.device_ns == -1


@pytest.fixture
def no_driver(monkeypatch):
    """No `cuThreadExchangeStreamCaptureMode` to call (an old or odd driver)."""
    from commviz.probe import cuda as probe_cuda

    monkeypatch.setattr(probe_cuda, "driver_capture_mode", lambda: "libcuda.so.1: cannot open shared object file")


@pytest.mark.parametrize("driver", ["thread-local mode", "no driver call: hold-off"])
def test_2_no_query_lands_while_another_thread_captures_in_global_mode(probe, fc, request, driver):
    """PyTorch #104555: an event query from another thread during a global-mode
    capture invalidates the capture."""
    if driver.startswith("no driver"):
        request.getfixturevalue("no_driver")
    x = FakeTensor(0)
    capturing, release = threading.Event(), threading.Event()

    def capture():
        with fc.stream(Stream(fc, 0)):
            g = torch.cuda.CUDAGraph()
            g.capture_begin()  # capture_error_mode="global", torch's default
            capturing.set()
            release.wait(5)
            g.capture_end()

    def job():
        fake_op(probe, "all_reduce")(x)  # pending: its stream has not run
        t = threading.Thread(target=capture)
        t.start()
        assert capturing.wait(5)
        fc.default[0].run(3.0)  # done on the device: a poll now would see it
        fc.seen_done.wait(0.3)  # …and would land inside the capture
        release.set()
        t.join(5)

    [(s, e)] = ops_of(probe, job)
    assert fc.invalidated == []
    assert e is not None and e.error == ""  # polled once the capture ended


def test_2_a_query_during_a_raw_global_capture_by_another_library_leaves_it_valid(probe, fc):
    """A capture begun outside torch.cuda.CUDAGraph (another library calling
    cudaStreamBeginCapture in global mode) is not counted by the probe, so polls go on
    during it: they must not invalidate it. The probe's CUDA thread runs in
    thread-local capture mode, as PyTorch's watchdog does around its query."""
    x = FakeTensor(0)
    capturing, release = threading.Event(), threading.Event()
    mode = []

    def capture():
        s = Stream(fc, 0)
        fc.raw_capture_begin(s, "global")
        capturing.set()
        release.wait(5)
        fc.raw_capture_end(s)

    def job():
        fake_op(probe, "all_reduce")(x)
        t = threading.Thread(target=capture)
        t.start()
        assert capturing.wait(5)
        fc.default[0].run(3.0)
        assert fc.seen_done.wait(5)  # polled, and answered, inside the capture
        mode.append(getattr(probe.cuda_side.poller, "capture_mode", None))
        release.set()
        t.join(5)

    [(s, e)] = ops_of(probe, job)
    assert fc.invalidated == []
    assert mode == ["thread_local"]
    assert e is not None and e.error == "" and e.device_ns == 0


def test_2_without_the_driver_call_the_poller_says_why_and_holds_off_for_cuda_graphs(probe, fc, no_driver):
    mode = []

    def job():
        fake_op(probe, "all_reduce")(FakeTensor(0))
        fc.default[0].run(1.0)
        assert fc.seen_done.wait(5)
        mode.append(getattr(probe.cuda_side.poller, "capture_mode", None))

    [(s, e)] = ops_of(probe, job)
    assert e is not None and e.error == ""
    assert mode[0].startswith("unavailable: libcuda.so.1")


def test_2_the_driver_call_really_is_there_on_a_machine_with_cuda():
    """Where libcuda is installed, the symbol the poller uses resolves (the call
    itself is exercised on a GPU by tests/gpu)."""
    from commviz.probe.cuda import driver_capture_mode

    got = driver_capture_mode()
    if isinstance(got, str):
        pytest.skip(f"no CUDA driver here ({got})")
    assert callable(got)


# 3 -------------------------------------------------------------------------------


def test_3_device_time_from_events_around_the_op_and_the_enqueue_time_apart(probe, fc):
    x = FakeTensor(1)
    seen = []

    def during(t):
        seen.append(len(fc.current_stream(1).recorded))  # the start event is already there
        fc.current_stream(1).run(10.0)  # the work queued before the op ends at 10 ms

    def job():
        fc.set_device(1)
        fake_op(probe, "all_reduce", during=during)(x)
        fc.current_stream(1).run(35.0)  # the op ends on the device at 35 ms

    [(s, e)] = ops_of(probe, job)
    assert seen == [1]
    assert e.error == "" and e.device_ns == 25_000_000
    assert 0 <= e.enqueue_ns <= e.t - s.t and not e.captured


def test_3_new_ops_leave_a_busy_pollers_backoff_and_wake_an_idle_one(fc):
    """Each wake of the poller takes the GIL from the launching thread (~80 µs an NCCL
    launch on an H200): ops handed to a poller that is already polling wait for its
    next poll; an idle poller is woken and polls finely again."""
    from commviz.probe.cuda import CudaPoller, CudaSide, Pending
    from commviz.probe.health import Health

    side = CudaSide(fc, lambda rec: None, Health())
    poller = CudaPoller(side)
    long_op = fc.Event()
    long_op.record(fc.default[0])  # never runs until the stream does
    poller.add(Pending(1, 0, None, long_op, None, -1, 0, ("g", -1)))
    poller.start()
    try:
        deadline = time.monotonic() + 5
        while poller.backoff.current < poller.backoff.hi and time.monotonic() < deadline:
            time.sleep(0.005)
        assert poller.backoff.current == poller.backoff.hi
        for i in range(50):
            poller.add(Pending(2 + i, 0, None, None, None, -1, 0, ("g", -1)))
        assert poller.backoff.current == poller.backoff.hi  # busy: not reset by new ops
        fc.default[0].run(1.0)
        while poller.pending and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not poller.pending
        time.sleep(0.05)  # it goes idle
        poller.add(Pending(99, 0, None, None, None, -1, 0, ("g", -1)))
        assert poller.backoff.current < poller.backoff.hi  # woken: polls finely again
    finally:
        poller.stop(1.0)


def test_3_an_op_on_a_stream_set_between_ops_is_timed_on_that_stream(probe, fc):
    """The probe keeps a Python object per stream, but asks which stream is current
    at every op: an op inside `with torch.cuda.stream(s)` is timed there."""
    from tests.probe.fake_cuda import Stream

    side_stream = Stream(fc, 0)

    def job():
        ar = fake_op(probe, "all_reduce")
        ar(FakeTensor(0))
        ar(FakeTensor(0))
        with fc.stream(side_stream):
            ar(FakeTensor(0))
        fc.default[0].run(1.0)  # the side stream has not run yet

    got = ops_of(probe, job)
    done = [e is not None and e.device_ns >= 0 for _, e in got]
    assert done == [True, True, False]
    side_stream.run(2.0)


def test_a_query_that_raises_ends_the_op_with_the_error(fc):
    from commviz.probe.cuda import CudaPoller, CudaSide, Pending
    from commviz.probe.health import Health

    ends = []
    side = CudaSide(fc, ends.append, Health())
    poller = CudaPoller(side)

    class Broken:
        def query(self):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    poller.add(Pending(4, 0, None, Broken(), None, 64, 10))
    poller.poll_once()
    [(kind, op_id, t, err, nbytes, peer, device_ns, enqueue_ns)] = ends
    assert op_id == 4 and "illegal memory access" in err and nbytes == 64 and poller.pending == []


# 4 -------------------------------------------------------------------------------


def test_4_the_rank_names_the_gpu_of_its_tensors_not_the_current_device(probe, fc):
    """A script that never calls set_device (model.to(rank)): the current device is
    0, the tensors are on GPU 3."""

    def job():
        fake_op(probe, "all_reduce")(FakeTensor(3))
        fc.default[3].run(1.0)

    hellos = [e for e in recorded(probe, job) if isinstance(e, Hello)]
    assert hellos[-1].device == "cuda:3"
    assert hellos[-1].cuda_uuid == f"GPU-{Props(3).uuid}" and hellos[-1].pci_bus_id == "0000:1b:00.0"


@pytest.mark.parametrize("backend", ["undefined", "cpu:gloo,cuda:nccl", "nccl"])
def test_4_a_backend_that_may_use_cuda_does_not_say_cpu_or_guess_a_gpu(probe, fc, backend):
    fc.set_device(0)
    assert probe._hello(0, WORLD, backend).device == "cuda"  # which one: from its first tensor


# 5 -------------------------------------------------------------------------------


def test_5_events_go_on_the_tensors_devices_current_stream(probe, fc):
    x = FakeTensor(1)
    side_stream = Stream(fc, 1)

    def job():
        fc.set_device(0)  # the current device is not the tensor's
        with fc.stream(side_stream):  # and the user runs GPU 1's work on a side stream
            fake_op(probe, "all_reduce")(x)
            assert len(side_stream.recorded) == 2  # before and after the op
        side_stream.run(4.0)

    [(s, e)] = ops_of(probe, job)
    assert e is not None and e.error == "" and e.device_ns == 0


# 6 -------------------------------------------------------------------------------


def test_6_a_gloo_isend_seen_first_does_not_send_a_cuda_isend_through_the_waiter(probe, fc):
    """The waiter's helper thread calls the C++ wait(): on NCCL work that makes the
    helper's stream wait, not the user's."""

    class GlooP2PWork(FakeWork):
        def get_future(self):
            raise RuntimeError("Work::getFuture not implemented")

        def is_completed(self):
            return True

    cpu = torch.ones(4)
    nccl_work = FakeWork(fc, 0)

    def job():
        fake_op(probe, "isend", result=lambda: GlooP2PWork(fc, 0))(cpu, 1)
        fake_op(probe, "isend", result=lambda: nccl_work)(FakeTensor(0), 1)
        fc.default[0].run(1.0)  # NCCL's stream waited for the user's before the send
        nccl_work.finish(2.0)

    got = ops_of(probe, job)
    assert nccl_work.waited_on == []
    assert got[1][1] is not None and got[1][1].error == "" and got[1][1].device_ns == 1_000_000


# 7 -------------------------------------------------------------------------------


def test_7_a_work_that_completes_with_an_exception_is_a_failed_op(probe, fc):
    work = FakeWork(fc, 0)

    def job():
        fake_op(probe, "all_reduce", result=lambda: work)(FakeTensor(0), async_op=True)
        work.finish(1.0, RuntimeError("NCCL error: remote process exited or there was a network error"))

    [(s, e)] = ops_of(probe, job)
    assert e is not None and "remote process exited" in e.error


class UnconvertibleWork(FakeWork):
    """torch 2.11's NCCL Work on an H200: `exception()` raises pybind's conversion
    TypeError whatever the op did (its C++ result, a std::exception_ptr, has no Python
    type), and the first call prints torch's deprecation warning on the job's stderr."""

    asked = 0

    def exception(self):
        UnconvertibleWork.asked += 1
        raise TypeError("Unable to convert function return value to a Python type! The signature was\n\t"
                        "(self: torch._C._distributed_c10d.Work) -> std::__exception_ptr::exception_ptr")


def test_7_a_work_whose_exception_binding_cannot_answer_is_not_a_failed_op_nor_asked_again(probe, fc):
    UnconvertibleWork.asked = 0
    works = [UnconvertibleWork(fc, 0, future=False) for _ in range(3)]  # coalesced batches' Works: no future

    def job():
        for w in works:
            fake_op(probe, "all_reduce", result=lambda w=w: w)(FakeTensor(0), async_op=True)
            w.finish(1.0)

    got = ops_of(probe, job)
    assert len(got) == 3 and all(e is not None and e.error == "" for _, e in got)
    assert UnconvertibleWork.asked == 1  # the binding cannot answer: asking again only costs


class UnconvertibleResultWork(UnconvertibleWork):
    """torch 2.11's NCCL Work as it is: a result future beside the unconvertible
    `exception()`."""

    def __init__(self, cuda, dev, **kw) -> None:
        super().__init__(cuda, dev, result=True, **kw)


def _with_backend(probe, backend, run) -> list:
    """`ops_of` a job whose groups' NCCL backend is `backend`."""
    def job():
        probe.ensure_started()
        probe.cuda_side.backend_of = lambda pg, dev: backend
        run()

    try:
        return ops_of(probe, job)
    finally:
        probe.cuda_side.backend_of = None


@pytest.mark.parametrize("make,words", [
    (lambda fc, future: FakeWork(fc, 0, future=future), "remote process exited"),
    (lambda fc, future: FakeWork(fc, 0, future=future, result=True), "remote process exited"),
    # torch 2.11's NCCL: the result future says, `exception()` cannot give the words
    (lambda fc, future: UnconvertibleResultWork(fc, 0, future=future), "COMM_ERROR"),
], ids=["no result future", "result future", "result future, exception() unconvertible"])
@pytest.mark.parametrize("future", [False, True])
def test_7_a_failed_work_is_a_failed_op_while_its_group_still_says_success(probe, fc, future, make, words):
    """NCCL's isCompleted() is true as soon as the Work holds an error; the group's
    get_error() says so only after the watchdog's next pass. The Work is asked."""
    work = make(fc, future)

    def run():
        fake_op(probe, "all_reduce", result=lambda: work)(FakeTensor(0), async_op=True)
        work.finish(1.0, RuntimeError("NCCL error: remote process exited or there was a network error"))

    [(s, e)] = _with_backend(probe, FakeNcclBackend("SUCCESS"), run)
    assert e is not None and words in e.error


@pytest.mark.parametrize("watchdog_passed", [False, True])
def test_7_a_work_that_succeeded_is_never_asked_its_deprecated_exception(probe, fc, watchdog_passed):
    """NCCL's Work says through its result future: `exception()` would print torch's
    deprecation warning on the job's stderr, for an op that did nothing wrong."""
    UnconvertibleWork.asked = 0
    works = [UnconvertibleResultWork(fc, 0, future=False) for _ in range(3)]

    def run():
        for w in works:
            fake_op(probe, "all_reduce", result=lambda w=w: w)(FakeTensor(0), async_op=True)
            w.finish(1.0)
            if watchdog_passed:
                w.watchdog_pass()

    got = _with_backend(probe, FakeNcclBackend("SUCCESS"), run)
    assert len(got) == 3 and all(e is not None and e.error == "" for _, e in got)
    assert UnconvertibleWork.asked == 0


def test_7_a_work_on_a_group_whose_backend_reports_an_error_is_not_asked(probe, fc):
    """The group's backend (ProcessGroupNCCL.get_error) said the op failed: the
    deprecated Work.exception() is not called."""
    backend = FakeNcclBackend("COMM_ERROR")
    UnconvertibleWork.asked = 0
    work = UnconvertibleWork(fc, 0, future=False)

    def job():
        probe.ensure_started()
        probe.cuda_side.backend_of = lambda pg, dev: backend
        fake_op(probe, "all_reduce", result=lambda: work)(FakeTensor(0), async_op=True)
        work.finish(1.0)

    try:
        [(s, e)] = ops_of(probe, job)
    finally:
        probe.cuda_side.backend_of = None
    assert UnconvertibleWork.asked == 0
    assert e is not None and "COMM_ERROR" in e.error


def test_7_a_blocking_coalesced_cuda_batch_ends_on_the_device_not_at_host_time(probe, fc):
    import contextlib

    from commviz.probe.patch import _wrap_coalescing

    @contextlib.contextmanager
    def coalescing(group=None, device=None, async_ops=False):
        yield type("CM", (), {"works": []})()  # blocking: torch waited, kept no work

    manager = _wrap_coalescing(coalescing, probe)
    x = FakeTensor(0)
    t_run = []

    def job():
        all_reduce = fake_op(probe, "all_reduce")
        with manager(async_ops=False):
            all_reduce(x)
            all_reduce(x)
        t_run.append(time.monotonic_ns())
        fc.default[0].run(8.0)

    got = ops_of(probe, job)
    assert len(got) == 2
    assert all(e is not None and e.error == "" and e.t >= t_run[0] and e.device_ns >= 0 for _, e in got)


# 8 -------------------------------------------------------------------------------


def test_8_a_blocked_nvml_sample_delays_no_cuda_completion(probe, fc, monkeypatch):
    """NVML's PCIe fallback blocks 20-40 ms a call (and longer on a sick GPU): the
    CUDA polling must not wait behind it."""
    from commviz.probe import samplers

    entered, release = threading.Event(), threading.Event()

    class StuckSampler:
        interval_s = 0.01
        topology = None  # as HostSampler before NVML answers

        def __init__(self, *a, **k):
            pass

        def due(self, t):
            return True

        def sample(self, t):
            entered.set()
            release.wait(5)
            return {}

        def close(self):
            pass

    monkeypatch.setattr(samplers, "HostSampler", StuckSampler)
    monkeypatch.setenv("COMMVIZ_SAMPLES", "1")
    monkeypatch.setattr(probe, "cfg", type(probe.cfg)(**{**probe.cfg.__dict__, "samples": True}))
    t_release = []

    def job():
        all_reduce = fake_op(probe, "all_reduce")
        all_reduce(torch.ones(1))  # starts the probe: the sampler is stuck from now on
        assert entered.wait(5)
        all_reduce(FakeTensor(0))
        fc.default[0].run(1.0)
        fc.seen_done.wait(3)
        t_release.append(time.monotonic_ns())
        release.set()

    got = ops_of(probe, job)
    e = got[-1][1]
    assert e is not None and e.error == "" and e.t < t_release[0]


# issue 33 ------------------------------------------------------------------------


def _coalesced_async_batch(probe, fc, work):
    import contextlib

    from commviz.probe.patch import _wrap_coalescing

    @contextlib.contextmanager
    def coalescing(group=None, device=None, async_ops=False):
        yield type("CM", (), {"works": [work]})()

    manager = _wrap_coalescing(coalescing, probe)
    x = FakeTensor(0)

    def job():
        all_reduce = fake_op(probe, "all_reduce")
        with manager(async_ops=True):
            all_reduce(x, async_op=True)
            all_reduce(x, async_op=True)
        fc.default[0].run(1.0)
        work.finish(1.0)

    return ops_of(probe, job)


def test_33_1_before_torch_2_11_a_coalesced_batchs_work_is_never_asked_for_its_future(probe, fc):
    """`ProcessGroupNCCL::endCoalescing` could leave the Work's future unset, and
    `get_future()` wraps whatever is there: asking could crash the rank."""

    class CoalescedWork(FakeWork):
        def get_future(self):
            pytest.fail("get_future() called on a coalesced batch's Work")

    probe.ensure_started()
    probe.cuda_side.coalesced_future = False  # what torch < 2.11 gets
    got = _coalesced_async_batch(probe, fc, CoalescedWork(fc, 0))
    assert len(got) == 2 and all(e is not None and e.error == "" for _, e in got)


def test_33_1_from_torch_2_11_a_coalesced_async_batch_is_timed_on_the_device(probe, fc):
    """torch 2.11 sets the coalesced Work's future (seen on an H200): each op of the
    batch gets its device time from an end event recorded in its callback."""
    probe.ensure_started()
    probe.cuda_side.coalesced_future = True
    got = _coalesced_async_batch(probe, fc, FakeWork(fc, 0))
    assert len(got) == 2 and all(e is not None and e.error == "" and e.device_ns >= 0 for _, e in got)


@pytest.mark.parametrize("version, asked", [("2.10.1", False), ("2.11.0+cu130", True), ("2.13.0+cpu", True),
                                            ("3.0.0a0", True), ("garbage", False)])
def test_33_1_which_torch_asks_a_coalesced_work_for_its_future(monkeypatch, version, asked):
    from commviz.probe.cuda import coalesced_future_set

    monkeypatch.setattr(torch, "__version__", version)
    assert coalesced_future_set() is asked


def test_33_2_the_long_op_audit_reads_on_the_ranks_gpu_not_gpu_0(probe, fc, monkeypatch):
    from commviz.probe import audit

    seen = []

    def read(backend):
        seen.append(fc.current_device())
        return audit.Audit(0, 0, "off: test")

    monkeypatch.setattr(audit, "read", read)
    monkeypatch.setattr(probe.hello, "device", "cuda:2")
    probe.auditor.soon()
    for _ in range(100):
        if seen:
            break
        time.sleep(0.02)
    assert seen == [2]  # the audit thread's current device is the rank's, set before the read
    monkeypatch.setattr(probe.hello, "device", "cuda")  # a rank whose GPU is not known yet: no read
    seen.clear()
    probe.auditor.soon()
    time.sleep(0.3)
    assert seen == []


def test_33_6_the_exit_audit_reads_nccls_recorder_after_destroy_process_group(probe, monkeypatch):
    """destroy_process_group() clears the default group before the exit audit runs:
    the audit must still know the backend was NCCL."""
    from commviz.probe.core import GroupInfo
    from commviz.probe.patch import _wrap_destroy

    monkeypatch.setattr(probe, "default_group", GroupInfo(None, "0", [0, 1, 2, 3], "nccl"))
    monkeypatch.setattr(probe, "groups", {})
    _wrap_destroy(lambda group=None: None, probe)()  # torch's part: nothing, here
    assert probe.default_group is None
    assert probe.auditor.backend() == "nccl"


def test_33_3_an_op_queued_behind_the_previous_one_on_its_communicator_is_timed_from_its_end(probe, fc):
    """Ops of one communicator run one after another on its NCCL stream: the second
    all_reduce, issued at 1 ms while the first ran until 10 ms, ran 10→12 ms: 2 ms,
    not the 11 ms between its start event and its end."""
    w1, w2 = FakeWork(fc, 1), FakeWork(fc, 1)
    x = FakeTensor(1)

    def job():
        fc.set_device(1)
        works = iter([w1, w2])
        op = fake_op(probe, "all_reduce", result=lambda: next(works))
        op(x, async_op=True)
        fc.current_stream(1).run(0.0)
        op(x, async_op=True)
        fc.current_stream(1).run(1.0)
        w1.finish(10.0)
        w2.finish(12.0)

    (s1, e1), (s2, e2) = ops_of(probe, job)
    assert e1.device_ns == 10_000_000 and e2.device_ns == 2_000_000


def test_33_3_the_backends_own_timing_is_used_where_nccl_keeps_it(probe, fc):
    """TORCH_NCCL_ENABLE_TIMING=1: Work._get_duration() is the kernel's time on the
    NCCL stream, measured by NCCL's own events; it wins over ours."""

    class TimedWork(FakeWork):
        def _get_duration(self):
            return 3.5  # ms, as torch returns it

    w = TimedWork(fc, 0)

    def job():
        fake_op(probe, "all_reduce", result=lambda: w)(FakeTensor(0), async_op=True)
        fc.default[0].run(0.0)
        w.finish(9.0)

    [(s, e)] = ops_of(probe, job)
    assert e.device_ns == 3_500_000


def test_33_3_the_first_op_on_each_communicator_says_so_and_is_left_out_of_time_stats(probe, fc):
    from commviz.model.state import device_time_ns

    probe.ensure_started()
    probe.cuda_side.comms.clear()

    def job():
        x = FakeTensor(0)
        ar = fake_op(probe, "all_reduce")
        ar(x)
        ar(x)
        fake_op(probe, "send")(x, 1)
        fake_op(probe, "send")(x, 1)
        fake_op(probe, "send")(x, 2)
        fc.default[0].run(5.0)

    got = ops_of(probe, job)
    assert [(s.op, s.peer, e.first) for s, e in got] == [
        ("all_reduce", -1, True), ("all_reduce", -1, False), ("send", 1, True), ("send", 1, False),
        ("send", 2, True)]
    assert device_time_ns(got[0][1]) is None and device_time_ns(got[1][1]) == got[1][1].device_ns


def test_33_5_the_poller_asks_only_the_oldest_op_of_each_communicator_and_reuses_events(fc):
    from commviz.probe.cuda import CudaPoller, CudaSide, Pending
    from commviz.probe.health import Health

    ends = []
    side = CudaSide(fc, ends.append, Health())
    poller = CudaPoller(side)  # driven by hand
    fc.set_device(0)
    works = [FakeWork(fc, 0, future=False) for _ in range(50)]
    for i, w in enumerate(works):
        poller.add(Pending(i, 0, None, None, w, -1, 0, ("g", -1)))
    fc.queries = 0
    poller.poll_once()
    assert fc.queries == 1 and not ends  # the oldest is running: the 49 behind it are not asked
    for w in works[:10]:
        w.finish(1.0)
    fc.queries = 0
    poller.poll_once()
    assert [e[1] for e in ends] == list(range(10)) and fc.queries == 11

    # 200 blocking ops one after another make a handful of events, not 400
    made = fc.events_made
    for i in range(200):
        start = side.event(0)
        start.record(fc.default[0])
        end = side.event(0)
        end.record(fc.default[0])
        poller.add(Pending(1000 + i, 0, start, end, None, -1, 0, ("g2", -1)))
        fc.default[0].run(float(i))
        poller.poll_once()
    assert len(ends) == 210 and fc.events_made - made <= 4


class FakeNcclBackend:
    def __init__(self, error="SUCCESS"):
        self.error = error

    def get_error(self):
        return type("ErrorType", (), {"name": self.error})()


def test_33_6_a_blocking_op_on_a_failed_communicator_ends_with_the_error(probe, fc):
    """No Work to ask: the end event completes after the watchdog aborted the
    communicator, so the group's get_error() is what says the op failed."""
    backend = FakeNcclBackend()

    def job():
        probe.ensure_started()
        probe.cuda_side.backend_of = lambda pg, dev: backend
        ar = fake_op(probe, "all_reduce")
        ar(FakeTensor(0))
        fc.default[0].run(1.0)
        time.sleep(0.05)
        backend.error = "TIMEOUT"
        ar(FakeTensor(0))
        fc.default[0].run(2.0)

    try:
        (s1, e1), (s2, e2) = ops_of(probe, job)
    finally:
        probe.cuda_side.backend_of = None
    assert e1.error == "" and e1.device_ns >= 0
    assert "TIMEOUT" in e2.error and "get_error" in e2.error and e2.device_ns == -1


def hand_poller(fc, backend):
    """A CUDA poller not started (each poll run by the test), on GPU 0, whose groups'
    backend is `backend`; the ends it pushes collect in the list returned."""
    from commviz.probe.cuda import CudaPoller, CudaSide
    from commviz.probe.health import Health

    ends = []
    side = CudaSide(fc, ends.append, Health())
    side.backend_of = lambda pg, dev: backend
    fc.set_device(0)
    return CudaPoller(side), side, ends


def test_33_6_ops_seen_done_in_one_poll_ask_their_group_once(fc):
    """A launch-bound loop completes many ops per poll: one `get_error()` answers for
    all of them (each call is Python on the poller, holding the GIL the launching
    thread wants); the next poll asks again, and a failure it reports ends its ops."""
    from commviz.probe.cuda import Pending

    class Counting(FakeNcclBackend):
        asked = 0

        def get_error(self):
            Counting.asked += 1
            return super().get_error()

    backend = Counting()
    poller, side, ends = hand_poller(fc, backend)
    pg = object()

    def ops(first: int, n: int) -> None:
        for i in range(first, first + n):
            start, end = side.event(0), side.event(0)
            start.record(fc.default[0])
            end.record(fc.default[0])
            poller.add(Pending(i, 0, start, end, None, -1, 0, ("g", -1), False, pg))
        fc.default[0].run(float(first))

    ops(0, 50)
    poller.poll_once()
    assert len(ends) == 50 and Counting.asked == 1
    backend.error = "COMM_ERROR"
    ops(50, 3)
    poller.poll_once()
    assert Counting.asked == 2
    assert len(ends) == 53 and all("COMM_ERROR" in e[3] for e in ends[50:])  # (END, id, t, error, ...)


def test_1_ops_on_two_gpus_done_in_one_poll_are_each_read_with_their_device_set(fc):
    """A poll sees every op done first, then reads their times: each read happens with
    its own GPU set, not the one the last query left (a call on the wrong device can
    open a CUDA context there)."""
    from commviz.probe.cuda import Pending

    poller, side, ends = hand_poller(fc, FakeNcclBackend())
    for i, dev in enumerate((2, 0)):
        start, end = side.event(dev), side.event(dev)
        start.record(fc.default[dev])
        end.record(fc.default[dev])
        poller.add(Pending(i, dev, start, end, None, -1, 0, ("g", -1)))
        fc.default[dev].run(1.0 + i)
    poller.poll_once()
    assert fc.violations == []
    assert len(ends) == 2 and all(e[3] == "" for e in ends)


def test_33_6_an_abort_during_a_poll_fails_the_op_whose_end_it_completed(fc):
    """The watchdog aborts a communicator while a poll runs, which completes the end
    event of the op on it: the group is asked after every op of the poll was seen
    done, so that op is not given an answer taken before the abort."""
    from commviz.probe.cuda import Pending

    backend = FakeNcclBackend()
    poller, side, ends = hand_poller(fc, backend)
    pg = object()

    class AbortedOnQuery:  # an end event the abort completes, as it is asked
        def query(self):
            backend.error = "COMM_ERROR"
            return True

    done = fc.Event()
    done.record(fc.default[0])
    fc.default[0].run(1.0)
    poller.add(Pending(1, 0, None, done, None, -1, 0, ("a", -1), False, pg))
    poller.add(Pending(2, 0, None, AbortedOnQuery(), None, -1, 0, ("b", -1), False, pg))
    poller.poll_once()
    assert len(ends) == 2 and "COMM_ERROR" in ends[1][3]  # (END, id, t, error, ...)


def test_33_6_a_blocking_op_that_never_completes_reports_its_communicators_error(probe, fc):
    backend = FakeNcclBackend("COMM_ERROR")

    def job():
        probe.ensure_started()
        probe.cuda_side.backend_of = lambda pg, dev: backend
        fake_op(probe, "all_reduce")(FakeTensor(0))  # its stream never runs: a hang
        deadline = time.monotonic() + 5
        while probe.cuda_side.poller.pending and time.monotonic() < deadline:
            time.sleep(0.02)

    try:
        [(s, e)] = ops_of(probe, job)
    finally:
        probe.cuda_side.backend_of = None
    assert e is not None and "COMM_ERROR" in e.error


class FakeResult(FakeTensor):
    """A functional collective's output: the storage its wait names."""

    def __init__(self, device: int) -> None:
        super().__init__(device)
        self.ptr = id(self)

    def untyped_storage(self):
        return type("Storage", (), {"data_ptr": lambda s: self.ptr})()


def test_33_4_a_functional_collective_on_cuda_is_timed_on_the_device_and_ends_when_it_completes(probe, fc):
    """funcol gives no Work: the op starts with an event before it and ends with one
    recorded after its wait_tensor (the current stream then waits for it), so its end
    is when the GPU finished, not when the wait was enqueued, and it has device time."""
    from commviz.probe import calls
    from commviz.probe.kernels import Pending

    x, out = FakeTensor(0), FakeResult(0)
    t_wait = []

    def job():
        probe.ensure_started()
        pending = Pending(probe)
        rec = calls.begin_functional(probe, "funcol.all_reduce", c10d._get_default_group(), [x], False)
        fc.default[0].run(1.0)
        pending.watch(rec, [(out, out)], freed=False)
        pending.waited(out)  # the wait is enqueued: the stream will wait for the op
        t_wait.append(time.monotonic_ns())
        time.sleep(0.02)
        fc.default[0].run(7.0)  # the collective (and so the waiting stream) gets there at 7 ms

    [(s, e)] = ops_of(probe, job)
    assert s.op == "funcol.all_reduce" and s.is_async
    assert e.device_ns == 6_000_000 and e.t > t_wait[0] + 10_000_000 and 0 <= e.enqueue_ns <= e.t - s.t


def test_33_6_a_backend_whose_get_error_raises_leaves_a_running_op_running(fc):
    """A backend that cannot say (a wrapper over gloo on CUDA, an older torch) must
    not turn an op still running into a failed one."""
    from commviz.probe.cuda import CudaPoller, CudaSide, Pending
    from commviz.probe.health import Health

    class Mute:
        def get_error(self):
            raise RuntimeError("This backend doesn't support getError")

    ends = []
    side = CudaSide(fc, ends.append, Health(), backend_of=lambda pg, dev: Mute())
    poller = CudaPoller(side)
    fc.set_device(0)
    end = fc.Event(enable_timing=True)
    end.record(fc.default[0])  # never runs
    poller.add(Pending(1, 0, None, end, None, -1, 0, ("g", -1), pg=object()))
    poller.poll_once()
    assert ends == [] and len(poller.pending) == 1
    fc.default[0].run(1.0)
    poller.poll_once()
    assert [(e[1], e[3]) for e in ends] == [(1, "")]

"""CUDA ops, from the caller's thread to the probe's CUDA polling thread.

What torch and the CUDA runtime do, and why this module is shaped by it:
- A thread starts with device 0 current. A CUDA call on a thread with no context
  (`cudaEventQuery` does not guard its device; PyTorch's NCCL watchdog does) opens
  one on GPU 0: ~500 MiB per rank on the wrong GPU. The polling thread sets the
  device of every event and Work before it touches them (`torch.cuda.set_device`,
  once per change of device on that thread).
- An event recorded on a stream that is being captured into a CUDA graph is not a
  point in time: it runs at every replay, and querying it fails
  (`cudaErrorCapturedEvent`). An op on a capturing stream gets no event and is
  reported as captured. A query landing while another thread captures in the
  default "global" mode invalidates that capture (PyTorch #104555): the CUDA
  runtime forbids "potentially unsafe" calls on a thread in global mode while any
  other thread has a global capture open. PyTorch's watchdog puts its query in
  thread-local mode (C++ `CUDAStreamCaptureModeGuard`); torch binds no Python call
  for that (`torch.cuda.cudart()` has the profiler, host registration, streams and
  memory info, not `cudaThreadExchangeStreamCaptureMode`), so the poller sets its
  own thread to thread-local mode through the driver (`cuThreadExchangeStreamCaptureMode`
  in libcuda, which every CUDA process has loaded) before its first query: the
  mode belongs to the calling thread, and this thread never captures, so captures
  begun anywhere else, by `torch.cuda.graph` or by raw stream capture in another
  library, are left alone. Where the driver call is not there or fails, the poller
  falls back to holding off while a capture begun through `torch.cuda.CUDAGraph` is
  open (captures begun by other means are then not guarded).
- Device time is the backend's own where it keeps one: with `TORCH_NCCL_ENABLE_TIMING=1`
  ProcessGroupNCCL records events on its own stream around the kernel, and
  `Work._get_duration()` reads them. Otherwise it comes from two timing events on the
  tensor's device's current stream, one before the op and one after it (a sync NCCL
  op makes that stream wait for the NCCL stream; an async op's future callback runs
  on a stream that waits for it), read with `elapsed_time` on the polling thread.
  Ops of one communicator run one after another on its NCCL stream, so an op issued
  while the one before it still ran began when that one ended: its time is counted
  from the later of its start event and the previous op's end event, and queueing
  behind the earlier op is not in it. The host time to enqueue is kept apart.
- NCCL creates a communicator lazily, inside the first op that needs it (each p2p
  pair has its own): that op's time is mostly setup. Its end says `first`, and the
  model leaves it out of the time statistics. A group made with `device_id` (eager
  init) has its collective communicator already.
- The poller keeps one FIFO per device and communicator and asks each only about its
  oldest op: ops of one communicator complete in order, so nothing behind an
  incomplete op needs a query. Timing events are reused once read (a pool per
  device), not created twice per op.
- Whether an op failed: the group's backend, `get_error()` (ProcessGroupNCCL), is
  asked once the op is seen done, and every second while it is not: a blocking op has
  no Work to ask, and its end event completes even when the watchdog aborted the
  communicator. Where the group reports nothing, an async op's Work is asked itself:
  NCCL's `isCompleted()` is true as soon as the Work holds an error, before the
  watchdog tells the group (and its future completed at enqueue). It is asked through
  `get_future_result()`, which isCompleted() completes with COMM_ERROR when it finds
  the error. `Work.exception()` is asked only for a failure's words, or of a Work with
  no result future: torch deprecates it with a warning printed on the job's stderr, and
  on torch 2.11's NCCL it cannot return at all (pybind's "Unable to convert function
  return value" TypeError, seen on an H200 for an all_reduce that succeeded), so the
  first such answer stops the asking.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from commviz.events import end_record
from commviz.probe import transparent

# CUstreamCaptureMode / cudaStreamCaptureMode
CAPTURE_GLOBAL, CAPTURE_THREAD_LOCAL, CAPTURE_RELAXED = 0, 1, 2


def driver_capture_mode():
    """The CUDA driver's `cuThreadExchangeStreamCaptureMode` as `(mode) -> (result,
    previous mode)` for the calling thread, or a string saying why it is not there.
    The runtime's `cudaThreadExchangeStreamCaptureMode` (what PyTorch's C++ guard
    calls) forwards to it; the driver is one library per process, whichever CUDA
    runtime torch was built with."""
    import ctypes
    import sys

    name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        fn = ctypes.CDLL(name).cuThreadExchangeStreamCaptureMode
    except (OSError, AttributeError) as exc:
        return f"{name}: {exc}"
    fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
    fn.restype = ctypes.c_int

    def exchange(mode: int) -> tuple[int, int]:
        m = ctypes.c_int(mode)
        return fn(ctypes.byref(m)), m.value

    return exchange

POOL_MAX = 512  # timing events kept for reuse, per device (two per op in flight)
STREAMS_MAX = 256  # current-stream objects kept, by the stream's id
ERROR_CHECK_S = 1.0  # how often a blocking op still running asks its group for an error


class CudaCall:
    """What the caller's thread learnt about a CUDA op before it ran (truthy).
    `comm`: which communicator (its NCCL stream) it runs on, as (group id, peer: -1
    for collectives); `first`: the first op this rank ran on it; `pg`: the group,
    asked whether the op failed."""

    __slots__ = ("dev", "start", "captured", "comm", "first", "pg")

    def __init__(self, dev: int, start, captured: bool = False, comm=None, first: bool = False, pg=None) -> None:
        self.dev = dev
        self.start = start  # timing event recorded before the op, or None
        self.captured = captured
        self.comm = comm
        self.first = first
        self.pg = pg


class Pending:
    __slots__ = ("op_id", "dev", "start", "end", "work", "nbytes", "enqueue_ns", "comm", "first", "pg", "check_at")

    def __init__(self, op_id, dev, start, end, work, nbytes, enqueue_ns, comm=None, first=False, pg=None) -> None:
        self.op_id = op_id
        self.dev = dev
        self.start = start
        self.end = end
        self.work = work
        self.nbytes = nbytes
        self.enqueue_ns = enqueue_ns
        self.comm = comm
        self.first = first
        self.pg = pg  # the op's group: its backend says whether the op failed
        self.check_at = 0.0  # when next to ask the group for an error

    @classmethod
    def of(cls, op_id, call: CudaCall, start, end, work, nbytes, enqueue_ns) -> Pending:
        return cls(op_id, call.dev, start, end, work, nbytes, enqueue_ns, call.comm, call.first, call.pg)


class Backoff:
    """Poll sleep: fine resolution for short ops, little CPU for long ones. Back to
    fine only when work arrives at an idle poller (nothing pending): while any op is
    pending (ops keep coming, an irecv waits, a communicator hangs) an end is seen up
    to `hi` late, since every poll takes the GIL from the launching thread."""

    def __init__(self, lo: float = 5e-5, hi: float = 2e-3, factor: float = 1.5) -> None:
        self.lo, self.hi, self.factor = lo, hi, factor
        self.current = lo

    def next(self) -> float:
        s = self.current
        self.current = min(s * self.factor, self.hi)
        return s

    def reset(self) -> None:
        self.current = self.lo


# The first torch seen to set a future on the Work that ends a coalesced batch
# (bench/gpu_facts.py coalesced_future, torch 2.11 + NCCL 2.28 on an H200). Older ones
# may leave it null, and `get_future()` wraps a null future that crashes when used.
COALESCED_FUTURE_SINCE = (2, 11)


def coalesced_future_set() -> bool:
    try:
        import torch

        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    except Exception:
        return False
    return (major, minor) >= COALESCED_FUTURE_SINCE


def stream_key_of(cuda):
    """A cheap `(device) -> id of its current stream` for `cuda`, or None: torch's
    `_cuda_getCurrentStream` (stream id, device, device type), or a fake's own."""
    fn = getattr(cuda, "stream_key", None)
    if fn is not None:
        return fn
    try:
        import torch

        if cuda is torch.cuda:
            return torch._C._cuda_getCurrentStream
    except Exception:
        pass
    return None


def error_text(exc) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


# pybind's words when a binding's C++ result has no Python type: the binding failed,
# not the op (torch 2.11's NCCL Work.exception(), returning a std::exception_ptr)
UNCONVERTIBLE = "Unable to convert function return value"


# c10d's WorkResult, what `Work.get_future_result()` completes with. NCCL's Work
# completes it with COMM_ERROR from isCompleted() itself, the moment it finds the error
# (SUCCESS only at the watchdog's next pass); gloo and Python Works raise "not implemented".
WORK_RESULTS = {0: "SUCCESS", 1: "TIMEOUT", 2: "COMM_ERROR", 100: "UNKNOWN"}


def work_result(work) -> str | None:
    """The WorkResult a Work's result future holds: "" while it holds none yet, None
    when the Work has no such future. Asked instead of `exception()`, which torch
    deprecates with a warning printed on the job's stderr at its first call."""
    try:
        fut = work.get_future_result()
    except Exception:  # noqa: BLE001 - "not implemented": this Work cannot say this way
        return None
    if not fut.done():
        return ""
    try:
        value = int(fut.value())
    except Exception as exc:  # noqa: BLE001 - a future completed with an error
        return error_text(exc)
    return WORK_RESULTS.get(value, f"WorkResult {value}")


def work_error(work) -> str | None:
    """The failure a completed Work carries, "" when it succeeded, None when its
    binding cannot say (it never will: see UNCONVERTIBLE)."""
    try:
        exc = work.exception()
    except TypeError as raised:
        return None if UNCONVERTIBLE in str(raised) else error_text(raised)
    except Exception as raised:  # some bindings raise the stored exception
        return error_text(raised)
    return error_text(exc) if exc is not None else ""


class CudaSide:
    """The probe's CUDA side: `begin`/`end_*` on the caller's thread, a poller thread
    for completions. ``cuda`` is `torch.cuda` (a fake in tests)."""

    def __init__(self, cuda, push, health, on_device=None, backend_of=None) -> None:
        self.cuda = cuda
        self.push = push
        self.health = health
        self.on_device = on_device  # (index) -> None, once per device this rank uses
        self.backend_of = backend_of  # (pg, device index) -> its backend (get_error), or None
        self.devices: set[int] = set()
        self.comms: set = set()  # (group id, peer) this rank has run an op on
        self.pools: dict[int, list] = {}  # device -> timing events free for reuse
        self.captures = 0  # CUDA graph captures open in this process
        self.capture_lock = threading.Lock()  # a capture never begins mid-query
        self.poller: CudaPoller | None = None
        self._poller_lock = threading.Lock()
        self.stream_key = stream_key_of(cuda)  # (device) -> the current stream's id, cheaply
        self.coalesced_future = coalesced_future_set()
        self._streams: dict = {}  # that id -> its Stream object

    # ------------------------------------------------------------ caller's thread

    def begin(self, x, g=None, peer: int = -1) -> CudaCall:
        """Before a CUDA op on group `g` (a GroupInfo; `peer` for p2p): its device,
        whether its stream is capturing, and a timing event on the tensor's device's
        current stream. Never raises."""
        try:
            dev = x.get_device()
            if dev not in self.devices:
                self._new_device(dev)
            comm, first, pg = None, False, None
            if g is not None:
                comm, pg = (g.gid, peer), g.pg
                if comm not in self.comms:
                    self.comms.add(comm)
                    first = peer >= 0 or getattr(pg, "bound_device_id", None) is None
            if self._capturing(dev):
                return CudaCall(dev, None, True, comm, first, pg)
            ev = self.event(dev)
            ev.record(self.current_stream(dev))  # torch guards the stream's device
            return CudaCall(dev, ev, False, comm, first, pg)
        except Exception as exc:
            self.health.internal("cuda begin", exc)
            return CudaCall(-1, None)

    def current_stream(self, dev: int):
        """`torch.cuda.current_stream(dev)` for less (on an H200 it costs 3.5 µs a
        call, and an op needs two): the stream's id comes from torch's C call, and its
        Python Stream object is made once per stream. Which stream is current is
        asked every time: a `with torch.cuda.stream(s)` between ops is followed."""
        key = self.stream_key
        if key is None:
            return self.cuda.current_stream(dev)
        k = key(dev)
        s = self._streams.get(k)
        if s is None:
            if len(self._streams) >= STREAMS_MAX:
                self._streams.clear()
            s = self._streams[k] = self.cuda.current_stream(dev)
        return s

    def event(self, dev: int):
        """A timing event, from the device's pool when one is free."""
        pool = self.pools.get(dev)
        if pool:
            try:
                return pool.pop()
            except IndexError:  # another thread took the last one
                pass
        return self.cuda.Event(enable_timing=True)

    def recycle(self, dev: int, ev) -> None:
        """`ev` has completed and been read: it may be recorded again."""
        pool = self.pools.get(dev)
        if pool is None:
            pool = self.pools[dev] = []
        if len(pool) < POOL_MAX:
            pool.append(ev)

    def _capturing(self, dev: int) -> bool:
        cuda = self.cuda
        if cuda.current_device() == dev:
            return cuda.is_current_stream_capturing()
        with cuda.device(dev):
            return cuda.is_current_stream_capturing()

    def _new_device(self, dev: int) -> None:
        self.devices.add(dev)
        if self.on_device is not None:
            try:
                self.on_device(dev)
            except Exception as exc:
                self.health.internal("device info", exc)

    def end_sync(self, op_id: int, call: CudaCall, t0: int, nbytes: int = -1, enqueue_ns: int = -1) -> None:
        """After a blocking op, or the wait of a functional collective (whose host
        time to return, `enqueue_ns`, was taken when it returned): the current stream
        now waits for it, so an event recorded there completes once the op has. For a
        functional collective that also waits for compute queued before the wait."""
        if enqueue_ns < 0:
            enqueue_ns = time.monotonic_ns() - t0
        if call.captured or call.dev < 0:
            self._unpolled(op_id, call, nbytes, enqueue_ns)
            return
        end = None
        if call.start is not None:
            end = self.event(call.dev)
            end.record(self.current_stream(call.dev))
        self.poll(Pending.of(op_id, call, call.start, end, None, nbytes, enqueue_ns))

    def end_work(self, op_id: int, call: CudaCall, work, t0: int, nbytes: int = -1, coalesced: bool = False) -> None:
        """After an async op: its future's callback runs on a stream that waits for the
        op (torch's Future::invokeCallback); the end event goes there. Without a
        future, completion is polled on the Work alone (no device time). A coalesced
        batch's Work is asked for its future only from torch 2.11
        (`COALESCED_FUTURE_SINCE`): before, `ProcessGroupNCCL::endCoalescing` could
        leave it unset, and the binding wraps whatever is there."""
        enqueue_ns = time.monotonic_ns() - t0
        if call.captured or call.dev < 0:
            self._unpolled(op_id, call, nbytes, enqueue_ns)
            return
        fut = None
        if not coalesced or self.coalesced_future:
            try:
                fut = work.get_future()
            except Exception:
                fut = None
        if fut is None or call.start is None:
            self.poll(Pending.of(op_id, call, call.start, None, work, nbytes, enqueue_ns))
            return
        self.end_future(op_id, call, fut, enqueue_ns, nbytes, work)

    def end_future(self, op_id: int, call: CudaCall, fut, enqueue_ns: int, nbytes: int = -1, work=None) -> None:
        if call.captured or call.dev < 0:
            self._unpolled(op_id, call, nbytes, enqueue_ns)
            return

        def done(f) -> None:
            try:
                f.value()
            except Exception as exc:
                self.push(end_record(op_id, time.monotonic_ns(), error_text(exc), nbytes))
                return
            try:
                end = self.event(call.dev)
                end.record(self.current_stream(call.dev))
            except Exception as exc:
                self.health.internal("cuda completion", exc)
                end = None
            self.poll(Pending.of(op_id, call, call.start if end is not None else None, end, work, nbytes,
                                 enqueue_ns))

        fut.add_done_callback(done)

    def _unpolled(self, op_id: int, call: CudaCall, nbytes: int, enqueue_ns: int) -> None:
        """Ends that no poll can give. Captured: nothing ran, the op is in a CUDA graph
        and runs at each replay; its end says so, and no event was recorded that could
        fail later. No device known (begin failed, said once): the host's time."""
        self.push(end_record(op_id, time.monotonic_ns(), "", nbytes, -1, -1, enqueue_ns, call.captured, call.first))

    def poll(self, p: Pending) -> None:
        poller = self.poller
        if poller is None:
            with self._poller_lock:
                if self.poller is None:
                    self.poller = CudaPoller(self)
                    self.poller.start()
                poller = self.poller
        poller.add(p)

    def stop(self, grace_s: float) -> None:
        with self._poller_lock:
            poller, self.poller = self.poller, None
        if poller is not None:
            poller.stop(grace_s)
        self.pools.clear()  # the next poller starts with events of its own

    def resume(self) -> None:
        """The probe starts again (after `stop`): streams are looked up afresh."""
        self._streams.clear()
        self.stream_key = stream_key_of(self.cuda)

    # ------------------------------------------------------------- graph capture

    def patch_graphs(self, patched: list) -> None:
        """Count captures open in this process: `torch.cuda.graph` and torch.compile's
        CUDA graphs both go through `CUDAGraph.capture_begin` / `capture_end`."""
        G = getattr(self.cuda, "CUDAGraph", None)
        if G is None or getattr(G.capture_begin, "_commviz_original", None) is not None:
            return
        begin, end = G.capture_begin, G.capture_end
        side = self

        def capture_begin(graph, *args, **kwargs):
            with side.capture_lock:  # waits for at most one event query in flight
                side.captures += 1
            try:
                return begin(graph, *args, **kwargs)
            except BaseException:
                side.captures -= 1
                raise

        def capture_end(graph, *args, **kwargs):
            try:
                return end(graph, *args, **kwargs)
            finally:
                side.captures = max(0, side.captures - 1)
                if side.poller is not None:
                    side.poller.wake()

        transparent.mark_method(capture_begin, begin)
        transparent.mark_method(capture_end, end)
        G.capture_begin, G.capture_end = capture_begin, capture_end
        patched.append((G, "capture_begin", begin, capture_begin))
        patched.append((G, "capture_end", end, capture_end))


class CudaPoller:
    """The one thread that asks CUDA whether ops are done. Nothing else runs here:
    a `cudaEventQuery` that stalls (an NCCL hang, another thread holding the
    context lock) delays no flush, no stack capture and no NVML sample."""

    def __init__(self, side: CudaSide) -> None:
        self.side = side
        self.incoming: list[Pending] = []  # added since the last poll
        self.queues: dict[tuple, deque] = {}  # (device, communicator) -> its ops, oldest first
        self.last_end: dict[tuple, object] = {}  # (device, communicator) -> end event of its last op
        self.backends: dict[tuple, object] = {}  # (id(pg), device) -> backend with get_error, or None
        self._answers: dict[tuple, str] = {}  # (id(pg), device) -> what get_error said, this poll
        self.ask_work = True  # Work.exception() can answer (not on torch 2.11's NCCL)
        self._no_result: set[type] = set()  # Work types whose get_future_result() is not implemented
        self.backend_timing: bool | None = None  # Work._get_duration() answers (TORCH_NCCL_ENABLE_TIMING)
        self.backoff = Backoff()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop_at: float | None = None
        self._idle = False  # waiting for ops, to be woken by the next `add` (under _lock)
        self._dev: int | None = None  # the device this thread has set
        # "thread_local" once this thread's capture mode is set (its queries are then
        # safe during any other thread's capture), else why not: polls then hold off
        # during CUDAGraph captures
        self.capture_mode = ""
        self.thread = threading.Thread(target=self._run, name="commviz-cuda", daemon=True)

    @property
    def pending(self) -> list[Pending]:
        """Every op not yet seen complete (a copy; the poller changes the queues under
        `_lock` only when it adds to them, so this copy retries if one changed)."""
        for _ in range(100):
            try:
                with self._lock:
                    return [p for q in list(self.queues.values()) for p in list(q)] + list(self.incoming)
            except RuntimeError:  # a queue changed size while it was copied
                continue
        return []

    def start(self) -> None:
        self.thread.start()

    def add(self, p: Pending) -> None:
        """Hand over an op. The thread is woken only from its idle wait: while it has
        ops it polls on its own schedule. A wake per op cost the launching thread
        ~80 µs an NCCL launch on an H200 (bench/nccl_split.py), each one a switch of
        the GIL to this thread and back."""
        with self._lock:
            self.incoming.append(p)
            idle, self._idle = self._idle, False
        if idle:
            self.backoff.reset()
            self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, grace_s: float) -> None:
        """Let ops still completing land for up to `grace_s`, then end the thread."""
        self._stop_at = time.monotonic() + grace_s
        self._wake.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(grace_s + 0.5)

    def _thread_local_capture_mode(self) -> bool:
        """Set this thread's stream capture mode to thread-local, once, before any
        query (the mode stays with the thread). False, with the reason kept in
        `capture_mode`, where the driver has no such call or refuses it."""
        try:
            exchange = driver_capture_mode()
            if isinstance(exchange, str):
                self.capture_mode = f"unavailable: {exchange}"
                return False
            rc, _ = exchange(CAPTURE_THREAD_LOCAL)
        except Exception as exc:
            self.capture_mode = f"unavailable: {error_text(exc)}"
            return False
        if rc != 0:
            self.capture_mode = f"unavailable: cuThreadExchangeStreamCaptureMode returned {rc}"
            return False
        self.capture_mode = "thread_local"
        return True

    def _run(self) -> None:
        side = self.side
        safe = self._thread_local_capture_mode()
        while True:
            with self._lock:
                idle = self._idle = not self.queues and not self.incoming
            if self._stop_at is not None and (idle or time.monotonic() >= self._stop_at):
                return
            if idle:
                self._wake.wait(0.1)
                self._wake.clear()
                continue
            try:
                if safe:
                    self.poll_once()
                elif side.captures == 0:
                    with side.capture_lock:
                        if side.captures == 0:
                            self.poll_once()
            except Exception as exc:  # never let the thread die
                side.health.internal("cuda poll", exc)
            self._wake.wait(self.backoff.next())
            self._wake.clear()

    def _use(self, dev: int) -> None:
        if self._dev != dev:
            self.side.cuda.set_device(dev)
            self._dev = dev

    def poll_once(self) -> None:
        """Each FIFO from its oldest op, up to the first one still running."""
        with self._lock:
            new, self.incoming = self.incoming, []
        queues = self.queues
        for p in new:
            key = (p.dev, p.comm if p.comm is not None else ("op", p.op_id))
            q = queues.get(key)
            if q is None:
                q = queues[key] = deque()
            q.append(p)
        done = []  # (op, its queue, when seen done, error so far): this poll's, in order
        for key in list(queues):
            q = queues[key]
            while q:
                p = q[0]
                try:
                    seen = self._seen(p)
                    if seen is None:
                        break
                    done.append((p, key) + seen)
                except Exception as exc:  # e.g. an illegal address surfacing at the query
                    self.side.push(end_record(p.op_id, time.monotonic_ns(), error_text(exc), p.nbytes, -1, -1,
                                              p.enqueue_ns, False, p.first))
                q.popleft()
            if not q:
                del queues[key]
        # Whether each failed is asked after all were seen done: a group's answer (one
        # per group and poll) then postdates every completion it speaks for. A
        # communicator the watchdog aborts mid-poll completes its ops' end events too.
        self._answers.clear()
        for p, key, t, err in done:
            device_ns = -1
            try:
                self._use(p.dev)  # its events are read with its device set, as they were queried
                if not err:
                    err = self._failure(p, once=True)
                if not err:
                    device_ns = self._device_ns(p, key)
            except Exception as exc:  # its end is pushed whatever happens: the op is over
                err = err or error_text(exc)
            self.side.push(end_record(p.op_id, t, err, p.nbytes, -1, device_ns, p.enqueue_ns, False, p.first))

    def _seen(self, p: Pending) -> tuple[int, str] | None:
        """(when seen done, "" or why it failed) once `p` is done, else None. An op
        whose end event has not completed asks its group every ERROR_CHECK_S: a hung
        op on a communicator the watchdog found failed ends with that error."""
        self._use(p.dev)
        if p.work is not None and not p.work.is_completed():
            return None
        if p.end is not None and not p.end.query():
            if p.work is not None:  # done by its Work, not by its end event: failed?
                err = self._failure(p)
            elif p.pg is not None and time.monotonic() >= p.check_at:
                p.check_at = time.monotonic() + ERROR_CHECK_S
                err = self._group_error(p) or ""
            else:
                err = ""
            return (time.monotonic_ns(), err) if err else None
        return time.monotonic_ns(), ""

    def _failure(self, p: Pending, once: bool = False) -> str:
        """Why `p`, seen done, failed ("" if it did not): its group's backend first,
        then its Work. NCCL's isCompleted() is also true for a Work holding an error
        the watchdog has not yet passed to the group (and an async op's future
        completed at enqueue, before the op ran, so it cannot say)."""
        err = (self._group_error(p, once) or "") if p.pg is not None else ""
        if not err and p.work is not None:
            err = self._work_failure(p.work)
        return err

    def _work_failure(self, work) -> str:
        """Why a completed Work failed ("" if it did not). Its result future first:
        `exception()` prints torch's deprecation warning in the job, so it is asked
        only of a Work with no result future, or for the words of a failure."""
        kind = type(work)
        said = None if kind in self._no_result else work_result(work)
        if said is None:  # no result future: exception() is all this Work can say
            self._no_result.add(kind)
            return self._work_exception(work)
        if said in ("", "SUCCESS"):
            return ""
        return self._work_exception(work) or f"the Work completed with {said}"

    def _work_exception(self, work) -> str:
        if not self.ask_work:
            return ""
        said = work_error(work)
        if said is None:  # this torch's binding cannot answer: never asked again
            self.ask_work = False
            return ""
        return said

    def _device_ns(self, p: Pending, key: tuple) -> int:
        """The op's own time on the device: the backend's where it has one, else from
        our events, not counting the wait for the previous op on its communicator."""
        side = self.side
        ns = -1
        if p.work is not None and self.backend_timing is not False:
            try:
                ns = int(p.work._get_duration() * 1e6)  # ms → ns
                self.backend_timing = True
            except Exception:  # timing off: "Timing not enabled", or a backend without it
                if self.backend_timing is None:
                    self.backend_timing = False
        if ns < 0 and p.start is not None and p.end is not None:
            try:
                ms = p.start.elapsed_time(p.end)
                prev = self.last_end.get(key)
                if prev is not None:
                    since_prev = prev.elapsed_time(p.end)
                    if 0 <= since_prev < ms:
                        ms = since_prev  # it waited for the previous op on the stream
                ns = int(ms * 1e6)
            except Exception as exc:  # the op is done; only its device time is not known
                side.health.internal("cuda elapsed_time", exc)
        if p.start is not None:
            side.recycle(p.dev, p.start)
        if p.end is not None:
            prev = self.last_end.get(key)
            self.last_end[key] = p.end
            if prev is not None:
                side.recycle(p.dev, prev)
        return ns

    def _group_error(self, p: Pending, once: bool = False) -> str | None:
        """What the group's backend says went wrong with its communicator, "" if
        nothing, None if it cannot say. `once`: the answer already given in this poll,
        if any (see `poll_once`)."""
        k = (id(p.pg), p.dev)
        b = self.backends.get(k, False)
        if b is False:
            b = None
            try:
                if self.side.backend_of is not None:
                    b = self.side.backend_of(p.pg, p.dev)
            except Exception:
                b = None
            if b is not None and not callable(getattr(b, "get_error", None)):
                b = None
            self.backends[k] = b
        if b is None:
            return None
        said = self._answers.get(k) if once else None
        if said is not None:  # asked already in this poll: ops seen done together share the answer
            return said
        try:
            e = b.get_error()
        except Exception:  # a backend that cannot say (a wrapper, an older torch): never ask it again
            self.backends[k] = None
            return None
        name = getattr(e, "name", str(e))
        said = "" if name == "SUCCESS" else (
            f"NCCL reports {name} on this group's communicator (ProcessGroupNCCL.get_error()): "
            "the op did not complete normally")
        if once:
            self._answers[k] = said
        return said

"""A stand-in for `torch.cuda` that behaves as the CUDA runtime and torch do, where the
probe could get them wrong (read from torch/cuda/streams.py, ATen's CUDAEvent.h and
ProcessGroupNCCL.cpp):

- Each thread has a current device, 0 until it sets one. A CUDA call about a device
  other than the calling thread's current one is a violation: on a real GPU it opens
  a context (~500 MiB) on the thread's device. `Event.record` is exempt: torch
  guards the stream's device itself.
- Each thread has a current stream per device (the default one until changed).
- An event recorded on a capturing stream is captured: querying it raises, as
  `cudaErrorCapturedEvent` does. Each thread has a stream capture mode, "global"
  until it exchanges it (the driver's `cuThreadExchangeStreamCaptureMode`,
  `exchange_capture_mode` here): a query from a thread in global mode while another
  thread has a global-mode capture open invalidates that capture; a thread in
  thread-local or relaxed mode is not affected by other threads' captures. Captures
  begin through `torch.cuda.CUDAGraph` or by raw stream capture (`raw_capture_begin`,
  as another library calling `cudaStreamBeginCapture` does).
- Streams run only when the test says so: `stream.run(at_ms)` completes everything
  recorded on it so far, at that device time; `elapsed_time` is the difference.
- Events may be recorded again (a new point in time each time), as CUDA events can.
- A Work on a device: `is_completed()` queries (needs the device), is also true when
  it failed, `exception()` says how; its future's callback runs at once on the
  calling thread with a stream that waits for the work (torch's invokeCallback).
  Made with `result=True` it has NCCL's result future (`get_future_result()`, torch
  2.6+): isCompleted() completes it with COMM_ERROR when it finds the error, and only
  the watchdog's pass (`watchdog_pass()`) completes it with SUCCESS. Without, the
  base Work's binding raises "not implemented", as gloo's does.
"""

from __future__ import annotations

import contextlib
import threading


class Violation(RuntimeError):
    pass


class Stream:
    def __init__(self, cuda: "FakeCuda", device: int, follows=None) -> None:
        self.cuda = cuda
        self.device = device
        self.capturing = False
        self.follows = follows  # a FakeWork this stream waits for
        self.recorded: list = []

    def run(self, at_ms: float) -> None:
        """Everything recorded so far completes, at device time `at_ms`."""
        for ev in self.recorded:
            if ev.t_ms is None:
                ev.t_ms = at_ms
        self.recorded = []


class Props:
    def __init__(self, i: int) -> None:
        self.uuid = f"0000000{i}-1111-2222-3333-444444444444"
        self.pci_domain_id, self.pci_bus_id, self.pci_device_id = 0, 0x18 + i, 0
        self.name = "Fake H100"


class FakeCuda:
    _initialized = True

    def __init__(self, n: int = 4) -> None:
        self.n = n
        self._tls = threading.local()
        self.violations: list[str] = []
        self.default = {d: Stream(self, d) for d in range(n)}
        self.open_captures: list[tuple[int, Stream, str]] = []  # (thread ident, stream, mode)
        self.invalidated: list[str] = []
        self.queries = 0
        self.Event = _event_class(self)
        self.events_made = 0  # Event objects created
        self.recorded = 0  # Event.record calls
        self.seen_done = threading.Event()  # a query answered "done"
        self.queried = threading.Event()  # some thread asked about an event or a Work

    # -------------------------------------------------------- devices, streams

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return getattr(self._tls, "dev", 0)

    def set_device(self, d) -> None:
        self._tls.dev = _index(d)

    @contextlib.contextmanager
    def device(self, d):
        prev = self.current_device()
        self.set_device(d)
        try:
            yield
        finally:
            self.set_device(prev)

    def _streams(self) -> dict:
        s = getattr(self._tls, "streams", None)
        if s is None:
            s = self._tls.streams = {}
        return s

    def current_stream(self, device=None) -> Stream:
        d = self.current_device() if device is None else _index(device)
        return self._streams().get(d) or self.default[d]

    @contextlib.contextmanager
    def stream(self, s: Stream):
        streams = self._streams()
        prev = streams.get(s.device)
        streams[s.device] = s
        try:
            yield
        finally:
            if prev is None:
                streams.pop(s.device, None)
            else:
                streams[s.device] = prev

    def stream_key(self, device) -> tuple:
        """torch._C._cuda_getCurrentStream's part: an id of the current stream."""
        s = self.current_stream(device)
        return (id(s), s.device)

    def is_current_stream_capturing(self) -> bool:
        return self.current_stream().capturing

    def get_device_properties(self, d) -> Props:
        return Props(_index(d))

    # torch.cuda.CUDAGraph's C++ base (a dummy class in the CPU wheel) does this:
    def graph_begin(self, graph, pool=None, capture_error_mode: str = "global") -> None:
        graph.fake_stream = self.current_stream()
        self.raw_capture_begin(graph.fake_stream, capture_error_mode)

    def graph_end(self, graph) -> None:
        self.raw_capture_end(graph.fake_stream)

    # cudaStreamBeginCapture / cudaStreamEndCapture, by any library
    def raw_capture_begin(self, stream: Stream, mode: str = "global") -> None:
        stream.capturing = True
        self.open_captures.append((threading.get_ident(), stream, mode))

    def raw_capture_end(self, stream: Stream) -> None:
        stream.capturing = False
        self.open_captures[:] = [c for c in self.open_captures if c[1] is not stream]

    # the driver's cuThreadExchangeStreamCaptureMode: 0 global, 1 thread-local, 2 relaxed
    MODES = ("global", "thread_local", "relaxed")

    def exchange_capture_mode(self, mode: int) -> tuple[int, int]:
        prev = self.MODES.index(self.capture_mode())
        self._tls.mode = self.MODES[mode]
        return 0, prev

    def capture_mode(self) -> str:
        return getattr(self._tls, "mode", "global")

    # ---------------------------------------------------------------- rules

    def need(self, dev: int, what: str) -> None:
        td = self.current_device()
        if td != dev:
            msg = (f"{what} about device {dev} on thread {threading.current_thread().name} whose current "
                   f"device is {td}: a context on GPU {td}")
            self.violations.append(msg)
            raise Violation(msg)

    def query_landed(self) -> None:
        self.queries += 1
        me = threading.get_ident()
        if self.capture_mode() != "global":
            return  # only this thread's own captures could forbid its calls
        for owner, stream, mode in self.open_captures:
            if owner != me and mode == "global":
                self.invalidated.append(f"a query from thread {threading.current_thread().name} during a capture")


def _index(d) -> int:
    if isinstance(d, int):
        return d
    i = getattr(d, "index", None)
    return int(i) if i is not None else int(str(d).rsplit(":", 1)[-1])


def _event_class(cuda: FakeCuda):
    class Event:
        def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
            cuda.events_made += 1
            self.timing = enable_timing
            self.device = None
            self.stream = None
            self.captured = False
            self.t_ms = None

        def record(self, stream=None) -> None:
            cuda.recorded += 1
            stream = stream or cuda.current_stream()
            self.device = stream.device
            self.stream = stream
            self.t_ms = None  # recorded again: a new point in the stream
            self.captured = False
            if stream.capturing:
                self.captured = True
                return
            if stream.follows is None:
                stream.recorded.append(self)

        def _done(self) -> bool:
            if self.stream is None:
                return True  # never recorded: torch says done
            w = self.stream.follows
            if w is not None:
                if w.done and self.t_ms is None:
                    self.t_ms = w.done_at_ms
                return w.done
            return self.t_ms is not None

        def query(self) -> bool:
            cuda.queried.set()
            cuda.need(self.device, "cudaEventQuery")
            cuda.query_landed()
            if self.captured:
                raise RuntimeError("CUDA error: operation not permitted on an event last recorded in a capturing "
                                   "stream (cudaErrorCapturedEvent)")
            done = self._done()
            if done:
                cuda.seen_done.set()
            return done

        def elapsed_time(self, end) -> float:
            cuda.need(self.device, "cudaEventElapsedTime")
            cuda.query_landed()
            if not (self.timing and end.timing):
                raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
            if not (self._done() and end._done()):
                raise RuntimeError("CUDA error: device not ready")
            return end.t_ms - self.t_ms

        def synchronize(self) -> None:
            raise AssertionError("the probe synchronized on an event")

    return Event


class FakeTensor:
    """What the probe reads of a CUDA tensor."""

    def __init__(self, device: int, numel: int = 256) -> None:
        import torch

        self.device_index = device
        self.is_cuda = True
        self.dtype = torch.float32
        self.shape = [numel]
        self.nbytes = 4 * numel

    def get_device(self) -> int:
        return self.device_index

    def __bool__(self):
        raise AssertionError("the probe asked a CUDA tensor its truth value: that synchronizes the device")


class FakeFuture:
    def __init__(self, cuda: FakeCuda, work: "FakeWork") -> None:
        self.cuda = cuda
        self.work = work

    def value(self):
        return [None]

    def add_done_callback(self, cb) -> None:
        # NCCL's future is complete once the op is enqueued: the callback runs now,
        # on this thread, with a current stream that waits for the op.
        with self.cuda.device(self.work.dev), self.cuda.stream(Stream(self.cuda, self.work.dev, follows=self.work)):
            cb(self)


class ResultFuture:
    """A Work's result future (c10d WorkResult values): complete once, first word wins."""

    SUCCESS, TIMEOUT, COMM_ERROR = 0, 1, 2

    def __init__(self) -> None:
        self._value = None

    def complete(self, value: int) -> None:
        if self._value is None:
            self._value = value

    def done(self) -> bool:
        return self._value is not None

    def value(self) -> int:
        assert self._value is not None, "value() of an incomplete future blocks"
        return self._value


def _work_base():
    import torch.distributed as dist

    return dist.Work


class FakeWork(_work_base()):
    """A torch Work (a Python subclass, as custom backends make): torch's C++ wait()
    on it calls the `wait` below."""

    def __init__(self, cuda: FakeCuda, dev: int, future: bool = True, result: bool = False) -> None:
        super().__init__()
        self.cuda = cuda
        self.dev = dev
        self.done = False
        self.done_at_ms = None
        self.exc = None
        self.future = future
        self.result = ResultFuture() if result else None
        self.exception_asked = 0
        self.waited_on: list[str] = []

    def finish(self, at_ms: float, exc: BaseException | None = None) -> None:
        self.done_at_ms = at_ms
        self.exc = exc
        self.done = exc is None

    def is_completed(self) -> bool:
        self.cuda.queried.set()
        self.cuda.need(self.dev, "WorkNCCL::isCompleted (cudaEventQuery)")
        self.cuda.query_landed()
        if self.exc is not None and self.result is not None:
            self.result.complete(ResultFuture.COMM_ERROR)  # checkAndSetException
        return self.done or self.exc is not None

    def watchdog_pass(self) -> None:
        if self.result is not None and self.done:
            self.result.complete(ResultFuture.SUCCESS)

    def get_future_result(self):
        if self.result is None:
            return super().get_future_result()  # torch's: "not implemented"
        return self.result

    def exception(self):
        self.exception_asked += 1  # torch prints its deprecation warning at the first
        return self.exc

    def get_future(self):
        if not self.future:
            raise RuntimeError("Work::getFuture not implemented")
        return FakeFuture(self.cuda, self)

    def wait(self, timeout=None):
        self.waited_on.append(threading.current_thread().name)
        return True

    def __hash__(self):  # the probe keeps tracked works in a WeakKeyDictionary
        return id(self)

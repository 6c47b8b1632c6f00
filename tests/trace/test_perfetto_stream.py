"""The streaming Perfetto export (`export_stream`, what `commviz export --perfetto`
runs) gives the in-memory export's events (`to_chrome_trace` of a `keep_ops` model),
writes valid JSON, and keeps no op: the model's state is the bounded one `summary`
keeps, the writer's only lanes and a bounded hold.

The one documented difference: `tid` numbers are ids given as tracks first appear,
which in a stream is another order. The comparison names each track by its
thread_name instead, which is what the viewers show (ordered by thread_sort_index,
which is compared as it is)."""

import gc
import json
import pathlib
import tracemalloc

import numpy as np

from commviz.events import Batch, Mark, OpEnd, OpStart, Stopped, encode_batch
from commviz.model import Model, traces
from commviz.model.merge import order_events
from commviz.model.store import Chunk
from commviz.trace import perfetto, sources
from commviz.trace.file import TraceWriter
from commviz.trace.perfetto import ChromeTraceWriter, export_stream, to_chrome_trace
from commviz.trace.stream import open_trace
from tests.helpers import group, hello
from tests.model.test_device_time import job as cuda_job
from tests.trace.nesting import nesting_errors
from tests.trace.test_perfetto import overlapping_job
from tests.trace.test_stream import synth

US = 1000  # ns
OPS = 1000  # all_reduce steps of the memory test's 64 ranks (tracemalloc slows it ten times)
DATA = pathlib.Path(__file__).parent / "data"


def write(path, batches: list[Batch]) -> None:
    w = TraceWriter(path)
    for b in batches:
        w.write(encode_batch(b.rank, b.events))
    w.close()


def in_memory(path) -> dict:
    """As `commviz export` did it before: the whole trace loaded (`load_trace`'s
    loader), every op kept."""
    whole = sources.open_trace(path)
    m = Model(keep_ops=True)
    traces.ingest_trace(m, whole.batches, cut_off=whole.truncated, snapshot=whole.snapshot)
    return to_chrome_trace(m)


def streamed(path, out) -> tuple[dict, ChromeTraceWriter]:
    w = export_stream(open_trace(path), str(out))
    with open(out) as f:
        return json.load(f), w


def normal(doc: dict) -> tuple[list[str], dict]:
    """The events as a sorted list, each track named by its thread name, and the rest
    of the document."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    events = []
    for e in doc["traceEvents"]:
        e = dict(e)
        if "tid" in e and e["ph"] != "i":
            e["tid"] = names[(e["pid"], e["tid"])]
        events.append(json.dumps(e, sort_keys=True))
    return sorted(events), {k: v for k, v in doc.items() if k != "traceEvents"}


def assert_same(path, tmp_path) -> dict:
    want = in_memory(path)
    got, w = streamed(path, tmp_path / "out.json")
    assert normal(got) == normal(want)
    assert list(got) == list(want)  # the same keys, in the same order
    assert w.ops == sum(e["ph"] == "X" for e in want["traceEvents"]) and w.forced == 0
    assert nesting_errors(got) == []
    return got


def test_overlapping_async_ops_unfinished_ops_and_marks_stream_as_in_memory(tmp_path):
    """isend/irecv and async all_reduces in flight together, ending out of the order
    they started in (all_reduce #0 ends before the irecv posted before it): the same
    lanes as in memory, not the lanes of ends."""
    p = tmp_path / "t.cvz"
    write(p, overlapping_job())
    doc = assert_same(p, tmp_path)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 16 and sum("unfinished" in e["args"] for e in xs) == 4
    assert {e["name"] for e in doc["traceEvents"] if e["ph"] == "i"} == {"step 1"}


def test_errors_stopped_ranks_and_p2p_stream_as_in_memory(tmp_path):
    evs = {r: [hello(r), group()] for r in (0, 1)}
    for r in (0, 1):
        evs[r] += [OpStart(1, 100 * US, "all_reduce", "0", 0, 64), OpEnd(1, 200 * US, error="NCCL error: timeout"),
                   OpStart(2, 300 * US, "send" if r == 0 else "recv", "0", 0, 64, peer=1 - r),
                   OpEnd(2, 400 * US, bytes=32 if r else -1, peer=0 if r else -1),
                   Mark(450 * US, "step"), OpStart(3, 500 * US, "barrier", "0", 1, 0)]
    evs[1].append(Stopped(2 * 10**9, "commviz record", "hang", 3.0))
    p = tmp_path / "t.cvz"
    write(p, [Batch(1, r, e) for r, e in evs.items()])
    doc = assert_same(p, tmp_path)
    errs = [e for e in doc["traceEvents"] if e["ph"] == "X" and "error" in e["args"]]
    assert len(errs) == 2
    assert sorted(e["name"] for e in doc["traceEvents"] if e["ph"] == "i") == [
        "step", "step", "stopped by commviz record after 3 s (hang)"]


def test_device_time_streams_as_in_memory(tmp_path):
    p = tmp_path / "t.cvz"
    write(p, cuda_job())
    doc = assert_same(p, tmp_path)
    ar = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(ar) == 4 and all(e["args"]["device_us"] == 1000.0 and e["dur"] == 10000.0 for e in ar)


def test_a_synthetic_trace_streams_as_in_memory_through_the_batch_path(tmp_path):
    """Nearly every op of it goes the batch path (`model/columns.py`), which hands
    each to the writer exactly once."""
    p = tmp_path / "t.cvz"
    synth().write(str(p), ranks=16, ops=300)
    doc = assert_same(p, tmp_path)
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) == 16 * 300


def test_torch_files_stream_as_in_memory(tmp_path):
    """Read whole (`trace.stream` takes them in memory), fed through the same writer:
    a flight-recorder dump of a hang has ops that never finished."""
    doc = assert_same(DATA / "gloo_hang_json", tmp_path)
    assert any("unfinished" in e["args"] for e in doc["traceEvents"] if e["ph"] == "X")


def test_an_empty_trace_is_the_same_empty_document(tmp_path):
    p = tmp_path / "t.cvz"
    write(p, [Batch(1, 0, [hello(0, world=1)])])
    got, w = streamed(p, tmp_path / "out.json")
    assert got == in_memory(p) == {"traceEvents": [], "displayTimeUnit": "ms"} and w.ops == 0


def _fed_one_by_one(batches: list[Batch], flush_every: int = 1) -> tuple[dict, ChromeTraceWriter]:
    """The writer flushed after every `flush_every` events: an op may go out only once
    every op of its track that began before it has ended."""
    import io

    buf = io.StringIO()
    w = ChromeTraceWriter(buf)
    m = Model(flows=False, on_op=w.op, on_mark=w.mark)
    for k, (_, rank, ev) in enumerate(order_events(batches)):
        m.ingest(rank, ev)
        if k % flush_every == 0:
            w.flush(m)
    m.end_of_trace()
    w.finish(m)
    return json.loads(buf.getvalue()), w


def test_lanes_follow_starts_whatever_the_flushes(monkeypatch):
    want = normal(to_chrome_trace(_kept(overlapping_job())))
    for every in (1, 2, 3, 7):
        got, w = _fed_one_by_one(overlapping_job(), every)
        assert normal(got) == want, every
        assert w.origin_ok and w.forced == 0
    # Lanes given as ops end (nothing held) would differ: all_reduce #0 ends before
    # the irecv posted before it and would take its lane.
    monkeypatch.setattr(perfetto, "HOLD_MAX", 0)
    got, w = _fed_one_by_one(overlapping_job())
    assert w.forced and nesting_errors(got) == [] and normal(got) != want


def _kept(batches: list[Batch]) -> Model:
    m = Model(keep_ops=True)
    traces.ingest_trace(m, batches)
    return m


def hung_irecv_job(sends: int) -> list[Batch]:
    """An irecv that never completes while the rank's isends on its group go on."""
    evs = [hello(0, world=2), group(), OpStart(0, 10 * US, "irecv", "0", 0, 64, peer=1, is_async=True)]
    for k in range(1, sends + 1):
        evs += [OpStart(k, 100 * k * US, "isend", "0", k, 64, peer=1, is_async=True), OpEnd(k, (100 * k + 50) * US)]
    return [Batch(1, 0, evs)]


def test_ops_held_behind_a_hung_op_are_bounded_and_still_nest(monkeypatch):
    """Past HOLD_MAX the held ops go out before the op they wait for: every op once,
    all nesting, the lanes no longer the in-memory ones (documented)."""
    job = hung_irecv_job(50)
    got, w = _fed_one_by_one(job)
    assert normal(got) == normal(to_chrome_trace(_kept(job)))  # below the cap: the same
    monkeypatch.setattr(perfetto, "HOLD_MAX", 8)
    got, w = _fed_one_by_one(job)
    xs = [e for e in got["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 51 and len({(e["name"]) for e in xs}) == 51 and w.forced > 0
    assert nesting_errors(got) == []
    assert w._n_held <= 8


class _Chunks:
    """A stream handing on chunks in a given order (`TraceStream`'s face)."""

    truncated = False
    snapshot = False

    def __init__(self, parts: list[list[tuple[int, object]]]) -> None:
        self.parts = parts
        self.passes = 0

    def chunks(self, chunk=None):
        self.passes += 1
        for part in self.parts:
            yield Chunk([ev for _, ev in part], np.array([r for r, _ in part], np.int64))


def test_an_earlier_op_after_the_first_flush_writes_the_file_again(tmp_path):
    """The origin is taken at the first flush; a stream not in time order (here rank
    1's op, a second before anything else, comes in the second chunk) proves it wrong
    at the end, and the file is written again from the true one."""
    first = [(0, hello(0)), (0, group()), (0, OpStart(0, 5 * 10**9, "all_reduce", "0", 0, 64)),
             (0, OpEnd(0, 5 * 10**9 + 100))]
    second = [(1, hello(1)), (1, group()), (1, OpStart(0, 3 * 10**9, "all_reduce", "0", 0, 64)),
              (1, OpEnd(0, 3 * 10**9 + 100))]
    stream = _Chunks([first, second])
    w = export_stream(stream, str(tmp_path / "out.json"))
    assert stream.passes == 2 and w.origin_ok
    got = json.loads((tmp_path / "out.json").read_text())
    m = Model(keep_ops=True)
    for r, ev in first + second:
        m.ingest(r, ev)
    m.end_of_trace()
    assert normal(got) == normal(to_chrome_trace(m))
    assert got["otherData"]["origin_wall_ns"] == hello(1).wall_ns - hello(1).mono_ns + 3 * 10**9


def test_the_hook_sees_each_op_once_in_the_per_event_order(tmp_path):
    """`Model(on_op=...)` on the batch path gives the same calls, in the same order,
    as one event at a time."""
    p = tmp_path / "t.cvz"
    synth().write(str(p), ranks=8, ops=400)
    calls: list[list] = [[], []]
    a = Model(flows=False, on_op=lambda *x: calls[0].append(x))
    traces.ingest_chunks(a, open_trace(p).chunks())
    b = Model(flows=False, on_op=lambda *x: calls[1].append(x))
    traces.ingest_ordered(b, open_trace(p).events())
    assert len(calls[0]) == 8 * 400 and calls[0] == calls[1]
    assert a.done_ops == [] and a.summary() == b.summary()


def test_streaming_keeps_no_op(tmp_path, monkeypatch):
    """64 ranks x 1,000 all_reduce (64,000 ops): the model keeps no op and the
    export's traced peak is the model's own (what `summary` keeps) plus a chunk and a
    write buffer — far below the in-memory export's, which holds every op."""
    p = tmp_path / "t.cvz"
    synth().write(str(p), ranks=64, ops=OPS)
    out = tmp_path / "out.json"

    def peak(fn) -> int:
        gc.collect()
        tracemalloc.start()
        try:
            fn()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    held = []

    class Watched(ChromeTraceWriter):
        def flush(self, model):
            super().flush(model)
            held.append((len(model.done_ops), self._n_held))

    def export():
        w = export_stream(open_trace(p), str(out))
        assert w.ops == 64 * OPS and w.origin_ok

    def summary():
        traces.ingest_chunks(Model(flows=False), open_trace(p).chunks())

    monkeypatch.setattr(perfetto, "ChromeTraceWriter", Watched)
    streaming, model_only = peak(export), peak(summary)
    assert len(held) >= 2 and all(kept == 0 for kept, _ in held)  # no op kept by the model, ever
    assert max(h for _, h in held) <= 64  # held: at most an op a rank, between two chunks
    # keeping every op costs at least its PairedOp and its two events (shapes, lists
    # and the document's dicts come on top): the streaming export's cost beyond the
    # model's own is a small part of even that
    keep_all = 64 * OPS * _kept_bytes_per_op(p)
    # measured: 70.1 MB against the model's own 68.8 MB; keeping every op >= 19.5 MB more
    assert streaming - model_only < 0.25 * keep_all, (streaming, model_only, keep_all)
    doc = json.loads(out.read_text())
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) == 64 * OPS


def _kept_bytes_per_op(p) -> int:
    """A lower bound of what a `keep_ops` model holds per op: the objects themselves."""
    import sys

    m = Model(keep_ops=True, flows=False)
    for k, (_, rank, ev) in enumerate(open_trace(p).events()):
        m.ingest(rank, ev)
        if len(m.done_ops) >= 100:
            break
    return min(sys.getsizeof(op) + sys.getsizeof(op.start) + sys.getsizeof(op.end) for op in m.done_ops)

"""Device time where the probe measured it (issue 17, open point 2): a CUDA op's
OpEnd carries `device_ns`, its time on the GPU between CUDA events recorded around
it on its stream. Host time (call to the end the probe saw) also holds the poll
latency and, for an async op, the wait for the GPU to get to it, so p50/p99 and
algbw/busbw use the device time wherever it is known, in every reader."""

import json

import pytest

from commviz.cli import main
from commviz.events import Batch, OpEnd, OpStart, encode_batch
from commviz.model import traces
from commviz.model.state import Model
from commviz.trace.file import TraceWriter
from tests.helpers import group, hello

MS = 1_000_000  # ns
MB = 1_000_000
RANKS = (0, 1, 2, 3)


def cuda_op(op_id: int, t0: int, host_ns: int, device_ns: int, name: str = "all_reduce", seq: int = 0,
            nbytes: int = MB, captured: bool = False, first: bool = False, **kw) -> list:
    return [OpStart(op_id, t0, name, "0", seq, nbytes, "float32", [nbytes // 4], **kw),
            OpEnd(op_id, t0 + host_ns, device_ns=device_ns, enqueue_ns=20_000, captured=captured, first=first)]


def job() -> list[Batch]:
    """4 ranks, one all_reduce of 1 MB: 10 ms on the host clock, 1 ms on the GPU."""
    out = [Batch(1, r, [hello(r, world=4), group(ranks=RANKS)]) for r in RANKS]
    for r in RANKS:
        out.append(Batch(1, r, cuda_op(0, 1000, 10 * MS, 1 * MS)))
    return out


def test_an_op_with_device_time_is_timed_and_sized_by_it():
    m = Model()
    traces.ingest_trace(m, job())
    [row] = m.summary()["ops"]
    assert row["p50_us"] == 1000.0 and row["p99_us"] == 1000.0  # not 10,000: the host's time
    assert row["algbw_gbps"] == pytest.approx(1.0)  # 1 MB in 1 ms
    assert row["busbw_gbps"] == pytest.approx(1.5)  # all_reduce on 4 ranks: 2(n-1)/n


def test_p2p_ops_use_device_time_too_and_an_op_without_it_keeps_host_time():
    m = Model()
    for r in (0, 1):
        m.ingest(r, hello(r))
    m.ingest(0, group())
    for ev in cuda_op(0, 1000, 10 * MS, 2 * MS, name="send", peer=1):
        m.ingest(0, ev)
    for ev in cuda_op(0, 1000, 10 * MS, -1, name="recv", peer=0):  # no device time: the host's
        m.ingest(1, ev)
    rows = {r["op"]: r for r in m.summary()["ops"]}
    assert rows["send"]["p50_us"] == 2000.0 and rows["send"]["algbw_gbps"] == pytest.approx(0.5)
    assert rows["recv"]["p50_us"] == 10000.0


def test_a_captured_op_is_counted_but_not_timed():
    """Issued while its stream was captured into a CUDA graph: nothing ran then, so
    its host time says nothing about a transfer."""
    out = [Batch(1, r, [hello(r, world=4), group(ranks=RANKS)]) for r in RANKS]
    for r in RANKS:
        out.append(Batch(1, r, cuda_op(0, 1000, 10 * MS, -1, captured=True)))
        out.append(Batch(1, r, cuda_op(1, 20 * MS, 10 * MS, 1 * MS, seq=1)))
    m = Model()
    traces.ingest_trace(m, out)
    [row] = m.summary()["ops"]
    assert row["count"] == 2 and row["bytes"] == 2 * MB
    assert row["p50_us"] == 1000.0 and row["p99_us"] == 1000.0


@pytest.mark.parametrize("path", ["per event", "batch"])
def test_the_first_op_on_a_communicator_is_counted_but_not_timed(path):
    """NCCL sets a communicator up inside its first op: 2 s of setup is no transfer,
    and must not make the all_reduce look 2,000× slower at p99."""
    out = [Batch(1, r, [hello(r, world=4), group(ranks=RANKS)]) for r in RANKS]
    for r in RANKS:
        out.append(Batch(1, r, cuda_op(0, 1000, 2000 * MS, 2000 * MS, first=True)
                         + cuda_op(1, 3000 * MS, 10 * MS, 1 * MS, seq=1)))
    m = Model()
    if path == "batch":
        traces.ingest_trace(m, out)
    else:
        for b in out:
            for ev in b.events:
                m.ingest(b.rank, ev)
    [row] = m.summary()["ops"]
    assert row["count"] == 2 and row["bytes"] == 2 * MB
    assert row["p50_us"] == 1000.0 and row["p99_us"] == 1000.0


def test_the_straggler_window_times_an_instance_by_device_time():
    m = Model()
    traces.ingest_trace(m, job())
    [arrival] = m.stragglers.groups["0"]
    assert arrival.op_ns == 1 * MS


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "gpu.cvz"
    w = TraceWriter(p)
    for b in job():
        w.write(encode_batch(b.rank, b.events))
    w.close()
    return p


def test_summary_json_and_text_report_device_time(trace, capsys):
    assert main(["summary", str(trace), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["ops"]
    assert set(row) == {"op", "group", "count", "bytes", "p50_us", "p99_us", "algbw_gbps", "busbw_gbps"}
    assert row["p50_us"] == 1000.0 and row["busbw_gbps"] == pytest.approx(1.5)
    assert main(["summary", str(trace)]) == 0
    [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("all_reduce")]
    assert line.split()[-4:] == ["1000.0", "1000.0", "1.000", "1.500"]  # p50, p99, algbw, busbw


def test_the_ops_table_and_replay_show_device_time(trace):
    from commviz.trace.file import load
    from commviz.tui.feed import ReplayFeed
    from commviz.view.snapshot import take_snapshot
    from commviz.tui.widgets.tables import op_cells

    feed = ReplayFeed(load(str(trace)).batches)
    while not feed.done:
        feed.step()
    snap = take_snapshot(feed.model, feed.now_ns())
    [row] = snap.op_rows
    cells = [str(c) for c in op_cells(row)]
    assert "1,000" in cells and "10,000" not in cells


def test_parquet_has_the_device_time_beside_the_host_time(trace, tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    out = tmp_path / "pq"
    assert main(["export", str(trace), "--parquet", str(out)]) == 0
    [r] = pq.read_table(out / "rank-0.parquet").to_pylist()
    assert r["duration_ns"] == 10 * MS and r["device_ns"] == 1 * MS and r["enqueue_ns"] == 20_000
    assert r["captured"] is False


def test_perfetto_slices_span_host_time_and_carry_device_time(trace, tmp_path):
    out = tmp_path / "t.json"
    assert main(["export", str(trace), "--perfetto", str(out)]) == 0
    doc = json.loads(out.read_text())
    [s] = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 0]
    assert s["dur"] == 10_000.0 and s["args"]["device_us"] == 1000.0 and s["args"]["enqueue_us"] == 20.0
    assert "device_us" in doc["otherData"]["slice_time"]

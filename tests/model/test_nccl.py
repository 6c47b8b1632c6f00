"""NCCL's own view in the model (issue 51): a rank's `NcclComm` and `NcclOp` events
become per-communicator counts beside the probe's, in `summary --json`, whichever
way the trace is read; a trace without them reads as before, with no `nccl` key."""

from __future__ import annotations

import json

from commviz.cli import main
from commviz.events import NCCL_SINCE, Batch, NcclComm, NcclOp, encode_batch
from commviz.model import Model, traces
from commviz.trace.file import TraceWriter
from tests.helpers import group, hello, op

COMM = "00000000000000ab"


def _rank_events(rank: int) -> list:
    evs = [hello(rank), group(), *op(1, 100, 200), NcclComm(90, COMM, rank, 2, 1, "")]
    evs += [NcclOp(110 + i, COMM, "AllReduce", 1024, "ncclFloat32", 4096, i, channels=2, device_ns=50,
                   done_t=190) for i in range(3)]
    evs += [NcclOp(120, COMM, "Send", 10, "ncclInt8", 10, peer=1 - rank)]  # enqueue-only: no GPU time
    evs += [NcclOp(130, COMM, "AllReduce", 8, "ncclFloat32", 32, 3, captured=True)]  # captured ...
    evs += [NcclOp(140 + i, COMM, "AllReduce", 8, "ncclFloat32", 32, 3, device_ns=7, captured=True, replays=1)
            for i in range(5)]  # ... and replayed five times
    evs += [NcclComm(300, COMM, rank, -1, ended=True)]
    return evs


EXPECTED = {COMM: {"rank": None, "nranks": 2, "nodes": 1, "ended": True, "ops": {
    "AllReduce": {"count": 8, "bytes": 3 * 4096 + 5 * 32, "device_ns": 3 * 50 + 5 * 7, "timed": 8,
                  "captured": 1, "replays": 5},
    "Send": {"count": 1, "bytes": 10},
}}}


def _expected(rank: int) -> dict:
    doc = json.loads(json.dumps(EXPECTED))
    doc[COMM]["rank"] = rank
    return doc


def test_nccls_counts_sit_beside_the_probes_per_rank():
    m = Model()
    traces.ingest_trace(m, [Batch(NCCL_SINCE, r, _rank_events(r)) for r in (0, 1)])
    rows = m.summary()["per_rank"]
    assert [row["nccl"] for row in rows] == [_expected(0), _expected(1)]
    assert rows[0]["ops"]["all_reduce"] == {"count": 1, "bytes": 4096}  # the probe's own, untouched


def test_a_recorded_trace_reads_nccls_view_as_the_live_model_does(tmp_path, capsys):
    p = tmp_path / "t.cvz"
    w = TraceWriter(p)
    for r in (0, 1):
        w.write(encode_batch(r, _rank_events(r), schema=NCCL_SINCE))
    w.close()
    assert main(["summary", str(p), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["per_rank"]
    assert [row["nccl"] for row in rows] == [_expected(0), _expected(1)]


def test_without_nccls_events_the_summary_has_no_nccl_part():
    m = Model()
    traces.ingest_trace(m, [Batch(1, r, [hello(r), group(), *op(1, 100, 200)]) for r in (0, 1)])
    assert all("nccl" not in row for row in m.summary()["per_rank"])


def test_the_text_summary_shows_what_nccl_ran_and_where_ranks_disagree(tmp_path, capsys):
    p = tmp_path / "t.cvz"
    w = TraceWriter(p)
    for r in (0, 1):
        evs = _rank_events(r)
        if r == 1:  # rank 1 ran one AllReduce fewer than rank 0
            evs = [ev for ev in evs if not (isinstance(ev, NcclOp) and ev.seq == 2)]
        w.write(encode_batch(r, evs, schema=NCCL_SINCE))
    w.close()
    assert main(["summary", str(p)]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("what NCCL itself ran (its profiler plugin):")
    head, _, *rows = out[at + 1:at + 5]
    assert head.split() == ["nccl", "op", "communicator", "ranks", "count", "bytes", "GPU", "µs", "graph", "replays"]
    assert rows[0].split()[:4] == ["AllReduce", COMM, "2", "of"] and rows[0].split()[4:6] == ["2", "7–8"]
    assert rows[0].split()[-1] == "10"  # five replays on each rank
    assert rows[1].split()[:6] == ["Send", COMM, "2", "of", "2", "1"] and rows[1].split()[-2:] == ["–", "–"]


def test_without_nccls_events_the_text_summary_says_nothing_of_nccl(tmp_path, capsys):
    p = tmp_path / "t.cvz"
    w = TraceWriter(p)
    for r in (0, 1):
        w.write(encode_batch(r, [hello(r), group(), *op(1, 100, 200)]))
    w.close()
    assert main(["summary", str(p)]) == 0
    assert "NCCL" not in capsys.readouterr().out

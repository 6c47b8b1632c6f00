"""Streaming reads: a trace of any length is fed in the one order, in bounded memory,
and gives the same answers as reading it whole."""

import importlib.util
import pathlib

from commviz.events import encode_batch
from commviz.model import Model, traces
from commviz.model.merge import order_events
from commviz.trace.file import load
from commviz.trace.stream import open_trace
from tests.helpers import group, hello, op
from tests.trace.test_file import write

ROOT = pathlib.Path(__file__).resolve().parents[2]


def synth():
    spec = importlib.util.spec_from_file_location("bench_synth", ROOT / "bench" / "synth.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def summaries(path):
    whole = load(path)
    a = Model(hang_after_s=1.0)
    traces.ingest_trace(a, whole.batches, cut_off=whole.truncated)
    s = open_trace(path)
    b = Model(hang_after_s=1.0, flows=False)
    traces.ingest_ordered(b, s.events(), cut_off=s.truncated)
    return a.summary(), b.summary()


def test_synthetic_trace_streams_in_the_order_of_a_whole_read(tmp_path):
    p = tmp_path / "t.cvz"
    synth().write(str(p), ranks=16, ops=200)
    whole = order_events(load(p).batches)
    streamed = list(open_trace(p).events())
    assert streamed == whole
    a, b = summaries(p)
    assert a == b and a["ops"][0]["count"] == 200 and all(r["status"] == "exited" for r in a["ranks"])


def test_per_rank_files_stream_together(tmp_path):
    # rank 1's clock is 5 s ahead; its file sorts first but its events interleave
    write(tmp_path / "rank-0.cvz", [(0, [hello(0), group()]), (0, op(0, 10, 20)), (0, op(1, 30, 40, seq=1))])
    write(tmp_path / "rank-1.cvz", [(1, [hello(1, mono=5_000_000_000), group()]),
                                    (1, op(0, 5_000_000_012, 5_000_000_021)),
                                    (1, op(1, 5_000_000_031, 5_000_000_041, seq=1))])
    assert list(open_trace(tmp_path).events()) == order_events(load(tmp_path).batches)
    a, b = summaries(tmp_path)
    assert a == b and a["ops"][0]["count"] == 2


def test_cut_off_file_streams_up_to_its_last_whole_frame(tmp_path):
    p = tmp_path / "t.cvz"
    write(p, [(0, [hello(0), group()]), (1, [hello(1), group()]), (0, op(0, 0, 10)), (1, op(0, 1, 11)),
              (0, op(1, 20, 30, seq=1))])
    p.write_bytes(p.read_bytes()[:-5])
    s = open_trace(p)
    assert s.truncated and "truncated at offset" in s.problems[0]
    assert list(s.events()) == order_events(load(p).batches)
    a, b = summaries(p)
    assert a == b and {r["status"] for r in a["ranks"]} == {"dead"}


def test_events_are_read_as_they_are_needed(tmp_path):
    p = tmp_path / "t.cvz"
    synth().write(str(p), ranks=8, ops=8000)
    s = open_trace(p)
    it = s.events()
    next(it)
    assert 0 < s.bytes_done < s.total_bytes / 4  # the first event came before most of the file was read
    assert sum(1 for _ in it) + 1 == s_events(p)
    assert s.bytes_done == s.total_bytes


def s_events(p):
    return sum(len(b.events) for b in load(p).batches)


def test_a_bad_frame_is_named_and_the_stream_goes_on(tmp_path):
    from commviz.trace.file import frame_bytes, header_bytes

    good = encode_batch(0, [hello(0), group(ranks=(0,))])
    p = tmp_path / "t.cvz"
    p.write_bytes(header_bytes() + frame_bytes(good) + frame_bytes(b"\xc1garbage") + frame_bytes(encode_batch(0, op(0, 1, 2))))
    s = open_trace(p)
    assert len(list(s.events())) == 4
    assert s.info.bad_frames == 1 and "undecodable frame" in s.problems[-1]


def test_a_long_read_reports_progress(tmp_path, monkeypatch, capsys):
    from commviz.commands import _trace
    from commviz.trace import stream

    p = tmp_path / "t.cvz"
    synth().write(str(p), ranks=4, ops=2000)
    monkeypatch.setattr(stream, "PROGRESS_EVERY", 4096)
    seen = []
    s = open_trace(p, progress=lambda done, total, what: seen.append((what, done, total)))
    scanned = [x for x in seen if x[0] == "scanning"]
    assert len(scanned) > 10 and scanned == sorted(scanned) and scanned[-1][1] <= s.total_bytes == scanned[-1][2]
    seen.clear()
    list(s.events())
    assert len(seen) > 10 and seen == sorted(seen) and seen[-1][2] == s.total_bytes
    assert {what for what, _, _ in seen} == {"reading"}
    monkeypatch.setattr(_trace, "PROGRESS_FROM_BYTES", 0)
    monkeypatch.setattr(_trace, "PROGRESS_EVERY_S", 0.0)
    list(_trace.open_stream(p).events())
    err = capsys.readouterr().err
    assert f"commviz: reading {p}: " in err and "% (" in err


def _flat(chunks):
    return [(int(c.rank[i]), c.event(i)) for c in chunks for i in range(len(c))]


def test_batched_merge_hands_on_the_one_order(tmp_path, monkeypatch):
    """`chunks()` (numpy stamping, a frame at a time) against `events()` (one event at
    a time) on what makes stamping hard: a clock that steps back inside a frame and
    across frames, a hello that moves the offset mid-trace, group definitions with no
    stamp before any stamped event, per-rank files out of step, a cut-off tail."""
    from commviz.events import Counters, OpEnd, OpStart
    from commviz.model import merge

    monkeypatch.setattr(merge, "CHUNK", 64)  # many flushes on a short trace
    frames = [(0, [group(), hello(0)]), (1, [group(), group("1", (1,))]), (1, [hello(1, mono=7_000)])]
    for i in range(120):
        back = 500 if i % 17 == 3 else 0  # rank 0's clock steps back now and then
        frames.append((0, [OpStart(i, 1000 * i - back, "all_reduce", "0", i, 64), OpEnd(i, 1000 * i + 400 - 2 * back),
                           Counters(1000 * i + 450)]))
        frames.append((1, [OpStart(i, 7_000 + 1000 * i + 3, "all_reduce", "0", i, 64),
                           OpEnd(i, 7_000 + 1000 * i + 401)]))
        if i == 60:
            frames.append((1, [hello(1, mono=9_000), group()]))  # reconnect with a new offset
    write(tmp_path / "rank-0.cvz", [f for f in frames if f[0] == 0])
    write(tmp_path / "rank-1.cvz", [f for f in frames if f[0] == 1])
    with open(tmp_path / "rank-1.cvz", "ab") as f:
        f.write(b"\x10\x00\x00\x00abc")  # a frame cut off mid-write
    one = [(r, ev) for _, r, ev in open_trace(tmp_path).events()]
    many = _flat(open_trace(tmp_path).chunks())
    assert many == one and len(one) == 2 * 120 * 2 + 120 + 7


def test_batched_summary_matches_the_per_event_summary(tmp_path):
    p = tmp_path / "t.cvz"
    synth().write(str(p), ranks=12, ops=800)
    s = open_trace(p)
    a = Model(hang_after_s=1.0, flows=False)
    traces.ingest_ordered(a, s.events(), cut_off=s.truncated)
    b = Model(hang_after_s=1.0, flows=False)
    traces.ingest_chunks(b, open_trace(p).chunks(), cut_off=s.truncated)
    assert b.summary() == a.summary()
    assert b.summary()["ops"][0]["count"] == 800


def test_a_frame_broken_past_its_head_does_not_hold_the_rest_back(tmp_path):
    """The first pass counts a frame by its first bytes; the decoding pass must hand on
    that frame for the same rank even when the rest does not decode, or the merge
    waits for it to the end of the file, holding everything after in memory."""
    from commviz.trace.file import TraceWriter

    p = tmp_path / "t.cvz"
    w = TraceWriter(p)
    w.write(encode_batch(0, [hello(0), group()]))
    w.write(encode_batch(1, [hello(1), group()]))
    w.write(encode_batch(1, op(0, 5, 6)))
    w.write(encode_batch(1, op(1, 7, 8, seq=1))[:-3])  # rank 1's last frame, its tail gone
    for i in range(2000):  # rank 0 runs on alone
        w.write(encode_batch(0, op(i + 10, 100 + 10 * i, 105 + 10 * i, gid="x")))
    w.close()
    s = open_trace(p)
    sizes = [len(c) for c in s.chunk_merge(chunk=256)]
    assert len(sizes) > 10 and max(sizes) < 600  # handed on as it goes, not all at the end
    assert s.info.bad_frames == 1


def test_the_merge_sorts_as_lexsort_does_with_ties_and_inputs_out_of_index_order():
    """The merge's two stable sorts (`merge._merged_order`) against lexsort's (time,
    input, index), where an input's events come out of index order too."""
    import numpy as np

    from commviz.model.merge import _merged_order

    rng = np.random.default_rng(2)
    for _ in range(500):
        m, k = int(rng.integers(1, 300)), int(rng.integers(1, 6))
        i = rng.integers(0, k, m)
        t = rng.integers(0, rng.integers(1, 50), m)  # many ties
        n = np.zeros(m, np.int64)
        for q in range(k):
            sel = np.flatnonzero(i == q)
            n[sel] = np.arange(len(sel)) if rng.random() < 0.8 else rng.permutation(len(sel))
        assert _merged_order(t, i, n).tolist() == np.lexsort((n, i, t)).tolist()

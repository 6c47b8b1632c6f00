"""Replay of a trace on disk: read as it plays, never whole, and a seek restores the
nearest checkpoint of the index built beside it — to exactly the state reading the
whole trace up to there gives."""

import os

import pytest

from commviz.events import SCHEMA_VERSION, Batch, Counters, Mark, OpEnd, OpStart
from commviz.model import Model
from commviz.model.merge import ChunkMerge, order_events
from commviz.model.diagnosis import Kind
from commviz.trace import seek
from commviz.trace.file import load
from commviz.trace.stream import open_trace
from commviz.tui.feed import ReplayFeed
from tests.helpers import group, hello, op
from tests.trace.test_file import write
from tests.trace.test_stream import synth
from tests.tui.helpers import FakeClock


@pytest.fixture
def often(monkeypatch):
    """Checkpoints every few thousand events, so a small trace has many."""
    monkeypatch.setattr(seek, "MIN_SPACING", 3000)
    monkeypatch.setattr(seek, "CHECKPOINTS", 16)
    monkeypatch.setattr(seek, "CHUNK", 1000)


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("seek") / "t.cvz"
    synth().write(str(p), ranks=8, ops=2500)
    return p


def truth(path, target=None, n=None):
    """The model fed the trace read whole, up to time `target` or `n` events."""
    events = order_events(load(path).batches)
    m = Model()
    k = 0
    for t, r, ev in events:
        if (target is not None and t > target) or (n is not None and k >= n):
            break
        m.ingest(r, ev)
        k += 1
    if k == len(events):
        m.end_of_trace()
    return m, k


def streamed(path, **kw):
    kw.setdefault("index_process", False)
    return ReplayFeed(open_trace(path), clock=FakeClock(), **kw)


def same(feed, model, k):
    now = feed.now_ns()
    assert feed.position == k
    assert feed.model.summary(now) == model.summary(now)
    assert feed.model.rank_rows(now) == model.rank_rows(now)


def test_seeks_back_and_forth_give_the_state_a_whole_read_gives(trace_file, often, monkeypatch):
    restored = []
    real_load = seek.load
    monkeypatch.setattr(seek, "load", lambda ck: restored.append(ck.n) or real_load(ck))
    feed = streamed(trace_file)
    assert feed.index.done.wait(60) and not feed.index.state.error
    assert len(feed.index.state.checkpoints) >= 5
    for f in (0.9, 0.2, 0.55, 1.0, 0.0, 0.7, 0.71, 0.35):
        feed.seek(f)
        model, k = truth(trace_file, target=feed.now_ns())
        same(feed, model, k)
    # a seek back started from a checkpoint, not from the start of the trace; one
    # just ahead (0.70 -> 0.71) read on from where it was
    assert len(restored) >= 4 and all(n > 0 for n in restored)
    feed.close()


def test_step_back_past_a_checkpoint(trace_file, often):
    feed = streamed(trace_file)
    assert feed.index.done.wait(60)
    ck = feed.index.state.checkpoints[2]
    feed.seek_time(ck.t)
    for _ in range(3):
        feed.step()
    n = feed.position
    undone = feed.step_back()
    assert isinstance(undone, (OpStart, OpEnd)) and feed.position < n
    model, k = truth(trace_file, n=feed.position)
    same(feed, model, k)
    assert feed.step() is not None
    model, k = truth(trace_file, n=feed.position)
    same(feed, model, k)
    feed.close()


def test_playing_to_the_end_gives_what_summary_gives(trace_file):
    feed = streamed(trace_file)
    clock = feed._clock
    feed.advance()
    while not feed.done:
        clock.tick(5.0)
        feed.advance()
    model, k = truth(trace_file)
    assert feed.position == k
    assert feed.model.summary(feed.now_ns()) == model.summary(feed.now_ns())
    feed.close()


def test_the_index_counts_the_events_and_finds_the_exact_end(trace_file):
    events = order_events(load(trace_file).batches)
    feed = streamed(trace_file)
    assert feed.start_ns == events[0][0]
    assert feed.end_ns == events[-1][0]  # each rank's last frame: exact here
    assert feed.index.done.wait(60)
    assert feed.total == len(events) and feed.timeline.end == events[-1][0]
    assert f"0/{len(events)} events" in feed.status() and "indexing" not in feed.status()
    feed.close()


def test_the_timeline_of_a_streamed_trace_has_its_marks_and_diagnoses(tmp_path):
    # rank 1 never enters all_reduce #1: a hang where #1 began, and a mark before it
    p = tmp_path / "hang.cvz"
    write(p, [(0, [hello(0), group()]), (1, [hello(1), group()]), (0, op(0, 10, 20)), (1, op(0, 11, 21)),
              (0, [Mark(t=25, text="step 1")]), (0, op(1, 30, 40, seq=1)[:1]),
              (0, [Counters(t=20 * 10**9)]), (1, [Counters(t=20 * 10**9)])])
    feed = streamed(p)
    memory = ReplayFeed(load(p).batches, clock=FakeClock())
    assert feed.timeline_done.wait(30) and memory.timeline_done.wait(30)
    assert [(k.t, k.text, k.kind) for k in feed.timeline.ticks] == \
        [(k.t, k.text, k.kind) for k in memory.timeline.ticks]
    assert feed.timeline.ticks[0].text == "step 1" and Kind.HANG in {k.kind for k in feed.timeline.ticks}
    feed.close()


def test_the_index_runs_in_its_own_process_and_its_files_go_with_it(trace_file, often):
    feed = streamed(trace_file, index_process=True)
    assert feed.index.done.wait(120), feed.index.state.error
    st = feed.index.state
    assert not st.error and len(st.checkpoints) >= 3
    assert all(os.path.exists(ck.file) for ck in st.checkpoints)
    feed.seek(0.6)
    model, k = truth(trace_file, target=feed.now_ns())
    same(feed, model, k)
    d = feed.index.dir
    feed.close()
    assert not os.path.exists(d)


RAN = []


def _ran():
    RAN.append("unpickled")


class _Hostile:
    def __reduce__(self):
        return _ran, ()


def test_a_checkpoint_file_replaced_is_refused_unread_and_the_seek_reads_from_the_start(trace_file, often):
    import gzip
    import pickle

    feed = streamed(trace_file)
    assert feed.index.done.wait(60) and not feed.index.state.error
    for ck in feed.index.state.checkpoints:  # a pickle that runs code when loaded, in each one's place
        with gzip.open(ck.file, "wb") as f:
            pickle.dump(_Hostile(), f)
    feed.seek(0.6)
    assert RAN == []
    assert "is not the file the index wrote" in feed.index.state.error
    model, k = truth(trace_file, target=feed.now_ns())
    same(feed, model, k)
    feed.close()


def test_a_chunk_merge_resumed_from_its_state_hands_on_the_rest(tmp_path):
    # two files, clocks 5 s apart, so the merge holds events back between chunks
    write(tmp_path / "rank-0.cvz", [(0, [hello(0), group()])] + [(0, op(i, 100 * i, 100 * i + 50, seq=i))
                                                              for i in range(300)])
    write(tmp_path / "rank-1.cvz", [(1, [hello(1, mono=5_000_000_000), group()])] +
          [(1, op(i, 5_000_000_000 + 100 * i + 7, 5_000_000_000 + 100 * i + 60, seq=i)) for i in range(300)])
    s = open_trace(tmp_path)
    whole = [ev for c in s.chunk_merge() for ev in map(c.event, range(len(c)))]
    assert len(whole) == 2 * (2 + 600)
    m = ChunkMerge(s._sources(count=False), s.first_offset, chunk=100)
    it = iter(m)
    got = [ev for c in (next(it), next(it)) for ev in map(c.event, range(len(c)))]
    state = m.state()
    rest = [ev for c in s.chunk_merge(state) for ev in map(c.event, range(len(c)))]
    assert got + rest == whole == [ev for _, _, ev in order_events(load(tmp_path).batches)]


def test_a_trace_in_memory_replays_as_before():
    b = [Batch(SCHEMA_VERSION, 0, [hello(0), group()] + op(0, 10, 20))]
    feed = ReplayFeed(b, clock=FakeClock())
    assert feed.total == 4 and feed.timeline_done.wait(10)
    feed.seek(1.0)
    assert feed.done and feed.model.summary()["ops"][0]["count"] == 1


def test_commviz_replay_plays_the_file_streamed(trace_file, monkeypatch):
    from commviz.cli import main
    from commviz.commands import replay

    got = {}

    def dashboard(feed, title, **kw):
        got["title"], got["streamed"] = title, feed.total is None  # counted by the index, not by a whole read
        assert feed.index.done.wait(120), feed.index.state.error
        feed.seek(1.0)
        got["summary"] = feed.model.summary(feed.now_ns())
        feed.close()
        return 0

    monkeypatch.setattr(replay, "run_app", dashboard)
    assert main(["replay", str(trace_file)]) == 0
    model, _ = truth(trace_file)
    assert got["streamed"] and got["title"] == "commviz replay t.cvz"
    assert got["summary"]["ops"] == model.summary()["ops"]


def test_commviz_replay_of_a_trace_without_events_says_so(tmp_path, capsys):
    from commviz.cli import main

    p = tmp_path / "empty.cvz"
    write(p, [])
    assert main(["replay", str(p)]) != 0
    assert "no events to replay" in capsys.readouterr().err


def test_a_seek_past_what_the_index_has_read_stops_short_and_says_so(trace_file, often, monkeypatch):
    from commviz.tui import feed as feed_mod

    monkeypatch.setattr(feed_mod, "SEEK_READ_S", 0.0)  # every seek reads on too long
    feed = streamed(trace_file)
    feed.index.done.wait(60)
    feed.index = None  # no checkpoint to start from: the seek reads on from the start
    feed.seek(1.0)
    assert 0 < feed.position < truth(trace_file)[1]
    assert "the seek stopped short" in feed.status()
    model, k = truth(trace_file, target=feed.now_ns())  # exactly every event up to where it stopped
    same(feed, model, k)


def test_an_end_estimated_too_early_does_not_hold_playback_back(trace_file, monkeypatch):
    from commviz.trace.stream import TraceStream

    events = order_events(load(trace_file).batches)
    monkeypatch.setattr(TraceStream, "end_estimate", lambda self: events[len(events) // 2][0])
    monkeypatch.setattr(seek, "index_pass", lambda *a, **k: None)  # no index to say the real end
    feed = streamed(trace_file)
    clock = feed._clock
    feed.advance()
    for _ in range(3):
        clock.tick(100.0)  # far past the end at 1x
        feed.advance()
    assert feed.done and feed.position == len(events)


def test_a_failed_index_is_said_and_a_long_seek_stops_short(trace_file, often, monkeypatch):
    from commviz.tui import feed as feed_mod

    def broken(*a, **k):
        raise RuntimeError("no room on disk")

    monkeypatch.setattr(seek, "index_pass", broken)
    monkeypatch.setattr(feed_mod, "SEEK_READ_S", 0.0)
    feed = streamed(trace_file)
    assert feed.index.done.wait(30)
    assert "no seek index (RuntimeError: no room on disk)" in feed.status()
    feed.seek(1.0)
    assert not feed.done and "the seek stopped short" in feed.status()


def test_a_merge_state_resumes_twice_to_the_same_rest(trace_file):
    s = open_trace(trace_file)
    m = s.chunk_merge(chunk=1000)
    it = iter(m)
    next(it)
    state = m.state()
    first = [len(c) for c in s.chunk_merge(state)]
    assert sum(first) > 0 and [len(c) for c in s.chunk_merge(state)] == first


def test_a_seek_in_memory_where_a_rank_sent_events_before_its_hello(often):
    """order_events gives such events their rank's first Hello offset; the index's
    merge must too, or a checkpoint's event count points at another event."""
    b = [Batch(SCHEMA_VERSION, 0, [hello(0), group()])]
    b += [Batch(SCHEMA_VERSION, 0, op(i, 10 * i, 10 * i + 5, seq=i)) for i in range(10000)]
    early = [Batch(SCHEMA_VERSION, 1, [group("g1", (1,))] + op(1000 + i, 50_000 + 10 * i, 50_000 + 10 * i + 5,
                                                               gid="g1", seq=i)) for i in range(50)]
    b = b[:1] + early + [Batch(SCHEMA_VERSION, 1, [hello(1)])] + b[1:]
    events = order_events(b)
    feed = ReplayFeed(b, clock=FakeClock())
    assert feed.index.done.wait(60) and feed.index.state.checkpoints
    feed.seek(0.2)
    m = Model()
    k = 0
    for t, r, ev in events:
        if t > feed.now_ns():
            break
        m.ingest(r, ev)
        k += 1
    same(feed, m, k)

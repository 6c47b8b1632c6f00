"""A trace merged in a child process: the summary is the one the merge in this
process gives, to the problem lines, and the child never outlives the read."""

import os
import signal
import time

import pytest

from commviz.errors import CommvizError
from commviz.events import Counters, Mark, encode_batch
from commviz.model import Model, traces
from commviz.trace import readahead
from commviz.trace.file import frame_bytes, header_bytes
from commviz.trace.stream import open_trace
from tests.helpers import group, hello, op


@pytest.fixture
def small(monkeypatch):
    """A child for any trace, however small."""
    monkeypatch.setattr(readahead, "MIN_BYTES", 0)


def summary(path, child: bool):
    s = open_trace(path)
    m = Model(hang_after_s=1.0, flows=False)
    chunks = readahead.chunks(s) if child else s.chunks()
    assert isinstance(chunks, readahead.ChildMerge) == child
    traces.ingest_chunks(m, chunks, cut_off=s.truncated, snapshot=s.snapshot)
    return m.summary(), s.problems, s.info.bad_frames


def test_a_synthetic_job_summarised_through_the_child_is_the_same(tmp_path, small, synth):
    p = tmp_path / "t.cvz"
    synth.write(str(p), ranks=16, ops=400)
    mine, child = summary(p, False), summary(p, True)
    assert child == mine and mine[0]["ops"][0]["count"] == 400


def test_frames_with_marks_counters_a_bad_frame_and_a_cut_tail(tmp_path, small, synth):
    # frames the C reader takes with objects beside the columns (Counters, Mark),
    # one that does not decode, and a tail cut mid-frame: the child's reading finds
    # the problems, and they reach this process
    p = tmp_path / "t.cvz"
    synth.write(str(p), ranks=4, ops=300)
    extra = b"".join(frame_bytes(encode_batch(r, [*op(900 + r, 10**12 + r, 10**12 + 50, gid="x", seq=0),
                                                   Counters(t=10**12 + 60, dropped=3),
                                                   Mark(t=10**12 + 70, text=f"step {r}")]))
                     for r in range(4))
    data = p.read_bytes() + frame_bytes(encode_batch(1, [group("x", ranks=(0, 1, 2, 3))])) + extra
    p.write_bytes(data + frame_bytes(b"\xc1garbage") + frame_bytes(encode_batch(2, op(7, 1, 2)))[:-3])
    mine, child = summary(p, False), summary(p, True)
    assert child == mine
    _, problems, bad = child
    assert bad == 1 and any("undecodable" in x for x in problems) and any("truncated" in x for x in problems)


def test_per_rank_files_in_a_directory(tmp_path, small, write_trace):
    write_trace(tmp_path / "rank-0.cvz", [(0, [hello(0), group()]), (0, op(0, 10, 20)), (0, op(1, 30, 40, seq=1))])
    write_trace(tmp_path / "rank-1.cvz", [(1, [hello(1, mono=5_000_000_000), group()]),
                                          (1, op(0, 5_000_000_012, 5_000_000_021)),
                                          (1, op(1, 5_000_000_031, 5_000_000_041, seq=1))])
    mine, child = summary(tmp_path, False), summary(tmp_path, True)
    assert child == mine and mine[0]["ops"][0]["count"] == 2


@pytest.mark.parametrize("parent_late", [False, True])
def test_what_fails_in_the_child_is_raised_here(tmp_path, small, synth, monkeypatch, parent_late):
    """`parent_late`: the child fails and is gone before this process hands it its
    slots (on a loaded box, once: a BrokenPipeError instead of the child's words)."""
    p = tmp_path / "t.cvz"
    synth.write(str(p), ranks=4, ops=50)
    s = open_trace(p)

    def broken(*a, **kw):
        raise ValueError("the disk said no")
        yield

    monkeypatch.setattr(s, "chunks", broken)
    if parent_late:
        real = readahead.os.fdopen

        def late(fd, mode="r", buffering=-1, **kw):
            if mode == "wb" and buffering == 0 and os.getpid() == here:  # this process's end of the slots' pipe
                time.sleep(1.0)
            return real(fd, mode, buffering, **kw)

        here = os.getpid()
        monkeypatch.setattr(readahead.os, "fdopen", late)
    with pytest.raises(ValueError, match="the disk said no"):
        traces.ingest_chunks(Model(flows=False), readahead.chunks(s))


def test_a_child_killed_midway_is_an_error_that_names_the_way_round(tmp_path, small, synth, monkeypatch):
    p = tmp_path / "t.cvz"
    synth.write(str(p), ranks=16, ops=8000)  # 256,000 events: four chunks and more
    monkeypatch.setattr(readahead, "SLOTS", 1)  # the child waits on this process after one chunk
    it = readahead.chunks(open_trace(p))
    chunks = iter(it)
    next(chunks)
    os.kill(it.pid, signal.SIGKILL)
    with pytest.raises(CommvizError, match="killed by signal 9.*COMMVIZ_READAHEAD=0"):
        for _ in chunks:
            pass
    assert it.pid is None  # reaped


def test_a_read_left_early_ends_the_child(tmp_path, small, synth):
    p = tmp_path / "t.cvz"
    synth.write(str(p), ranks=16, ops=2000)
    it = readahead.chunks(open_trace(p))
    pid = it.pid
    chunks = iter(it)
    next(chunks)
    chunks.close()  # as a caller that raised mid-read would
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # gone, and reaped


def test_small_traces_foreign_files_and_the_switch_stay_in_this_process(tmp_path, synth, monkeypatch):
    p = tmp_path / "t.cvz"
    synth.write(str(p), ranks=4, ops=50)
    assert not readahead.worth_a_child(open_trace(p))  # under MIN_BYTES
    monkeypatch.setattr(readahead, "MIN_BYTES", 0)
    assert readahead.worth_a_child(open_trace(p))
    monkeypatch.setenv("COMMVIZ_READAHEAD", "0")
    assert not readahead.worth_a_child(open_trace(p))


def test_the_summary_command_reads_through_the_child(tmp_path, small, synth, capsys, monkeypatch):
    from commviz.cli import main

    p = tmp_path / "t.cvz"
    synth.write(str(p), ranks=8, ops=300)
    p.write_bytes(p.read_bytes() + header_bytes()[:3])  # stray bytes after the last frame
    assert main(["summary", "--json", str(p)]) == 0
    child = capsys.readouterr().out
    monkeypatch.setenv("COMMVIZ_READAHEAD", "0")
    assert main(["summary", "--json", str(p)]) == 0
    assert capsys.readouterr().out == child and '"problems"' in child


def test_a_file_cut_while_it_is_read_is_said_not_misread(tmp_path, small, synth):
    p = tmp_path / "t.cvz"
    synth.write(str(p), ranks=16, ops=2000)
    chunks = iter(readahead.chunks(open_trace(p)))
    first = next(chunks)
    frames = first.store.frames
    assert frames[0].events  # read again from the file, whole
    with open(p, "r+b") as f:
        f.truncate(200)  # then the file loses all but its first frames
    later = max(k for k in range(len(frames)) if k not in frames)  # one read from the file, not made yet
    with pytest.raises(readahead.TraceChanged, match="shorter than when it was read"):
        frames[later]
    chunks.close()

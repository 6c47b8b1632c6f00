"""The command line: help that says what to do next, errors that name the fix."""

import json

import pytest

from commviz.cli import main
from commviz.events import encode_batch
from commviz.trace.file import TraceWriter
from tests.helpers import group, hello, op


def trace(path, cut: int = 0):
    w = TraceWriter(path)
    for r in (0, 1):
        w.write(encode_batch(r, [hello(r), group()]))
        w.write(encode_batch(r, op(0, 0, 1000) + op(1, 2000, 2500, seq=1)))
    w.close()
    if cut:
        path.write_bytes(path.read_bytes()[:-cut])


def test_no_command_prints_help_with_next_steps(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    assert "commviz demo" in out and "commviz record" in out


def test_summary_json(tmp_path, capsys):
    p = tmp_path / "t.cvz"
    trace(p)
    assert main(["summary", str(p), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["ops"][0]["count"] == 2 and s["ops"][0]["bytes"] == 8192
    assert set(s) >= {"world_size", "backend", "ranks", "ops", "per_rank", "diagnoses"}
    # no goodbye in the file: the ranks did not exit cleanly
    assert {r["status"] for r in s["ranks"]} == {"dead"}


def test_summary_of_a_job_record_stopped_names_record(tmp_path, capsys):
    from commviz.events import Counters, OpStart, Stopped

    p = tmp_path / "t.cvz"
    w = TraceWriter(p)
    for r in (0, 1):
        w.write(encode_batch(r, [hello(r), group()]))
    w.write(encode_batch(0, [OpStart(0, 1000, "all_reduce", "0", 0, 64), Counters(25 * 10**9)]))
    w.write(encode_batch(1, [Counters(25 * 10**9)]))  # rank 1 never came; alive, heartbeating
    for r in (0, 1):
        w.write(encode_batch(r, [Stopped(25 * 10**9 + 5, "commviz record", "hang", 20.0)], schema=2))
    w.close()
    assert main(["summary", str(p)]) == 0
    out = capsys.readouterr().out
    assert "HANG: all_reduce #0" in out
    assert "stopped by commviz record after 20 s (hang)" in out and "killed?" not in out


def test_summary_of_a_cut_off_trace_says_so(tmp_path, capsys):
    p = tmp_path / "t.cvz"
    trace(p, cut=3)
    assert main(["summary", str(p)]) == 0
    out = capsys.readouterr().out
    assert "note:" in out and "truncated at offset" in out
    assert "all_reduce" in out


def test_summary_of_not_a_trace_names_the_problem(tmp_path, capsys):
    p = tmp_path / "x.cvz"
    p.write_text("hello")
    assert main(["summary", str(p)]) == 2
    assert "too short to be a commviz trace" in capsys.readouterr().err


def test_record_without_a_command_shows_an_example(tmp_path, capsys):
    assert main(["record", "-o", str(tmp_path / "t.cvz")]) == 2
    assert "commviz record -o t.cvz -- torchrun" in capsys.readouterr().err


def test_record_with_a_missing_program(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert main(["record", "-o", str(tmp_path / "t.cvz"), "--", "no-such-program-xyz"]) == 2
    assert "command not found: no-such-program-xyz" in capsys.readouterr().err


def test_record_fail_on_names_the_kinds(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["record", "-o", str(tmp_path / "t.cvz"), "--fail-on", "straggler,slow", "--", "true"])
    assert e.value.code == 2
    assert "unknown kind slow; kinds: desync, dead_rank, p2p_deadlock, hang, straggler" in capsys.readouterr().err


def test_commands_that_take_no_job(capsys):
    assert main(["summary", "x", "--", "torchrun"]) == 2
    assert "takes no command" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and "commviz 0.1.0" in capsys.readouterr().out


def test_export_perfetto(tmp_path, capsys):
    from commviz.events import Mark, OpStart

    p = tmp_path / "t.cvz"
    w = TraceWriter(p)
    for r in (0, 1):
        w.write(encode_batch(r, [hello(r), group()]))
        w.write(encode_batch(r, op(0, 1000, 3000, nbytes=4096) + [Mark(500, "step 0")]))
    w.write(encode_batch(1, [OpStart(1, 4000, "send", "0", 0, 64, peer=0)]))  # never ends
    w.close()
    out = tmp_path / "t.json"
    assert main(["export", str(p), "--perfetto", str(out)]) == 0
    assert "3 ops written" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    ops = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    ar = [e for e in ops if e["name"] == "all_reduce #0"]
    assert [e["pid"] for e in ar] == [0, 1] and all(e["dur"] == 2.0 and e["args"]["bytes"] == 4096 for e in ar)
    [hung] = [e for e in ops if e["name"] == "send #0"]
    assert hung["args"]["peer"] == 0 and hung["args"]["unfinished"] and hung["dur"] == 0.0
    assert {e["name"] for e in doc["traceEvents"] if e["ph"] == "i"} == {"step 0"}
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert names == {"rank 0 (h)", "rank 1 (h)"}


def test_quitting_watch_while_the_job_runs_marks_the_stop(monkeypatch):
    """`watch --record -- CMD`, q before the job ends: the trace says watch stopped it."""
    from commviz.commands import _dashboard
    from commviz.tui import app as tui_app

    events: list = []

    class Proc:
        def poll(self):
            return None

    class Job:
        proc = Proc()
        log_path = None

        def interrupt(self):
            events.append("SIGINT")

    class Feed:
        def note_stop(self, by, reason="", after_s=0.0):
            events.append((by, reason))

        def close(self):
            events.append("closed")

    monkeypatch.setattr(tui_app.WatchApp, "run", lambda self: None)
    assert _dashboard.run_app(Feed(), "t", job=Job()) == 0
    assert events == [("commviz watch", "quit while it ran"), "SIGINT", "closed"]  # marked before the signal

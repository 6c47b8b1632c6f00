"""Reading torch's flight recorder on the rank: entries become (group, op, time) with
the backend prefix and p2p peers dropped; off, empty and wrapped recorders say so."""

import json

import pytest

pytest.importorskip("torch")

from commviz.probe import audit  # noqa: E402


def entry(rid, name, pg="0", t=1_000):
    return {"record_id": rid, "profiling_name": name, "process_group": [pg, "default_pg"], "time_created_ns": t}


def with_dump(monkeypatch, entries):
    monkeypatch.setattr(audit, "_dump", lambda backend: json.dumps({"version": "2.10", "entries": entries}))


def test_entries_are_named_as_the_recorder_names_them_without_prefix(monkeypatch):
    with_dump(monkeypatch, [entry(0, "gloo:all_reduce"), entry(1, "nccl:send 0->1", "3", 2_000)])
    a = audit.read("gloo")
    assert a.state == ""
    assert [(o.group, o.op, o.t_wall) for o in a.ops] == [("0", "all_reduce", 1_000), ("3", "send", 2_000)]


def test_a_wrapped_recorder_is_said_not_counted(monkeypatch):
    with_dump(monkeypatch, [entry(5, "gloo:all_reduce"), entry(6, "gloo:all_reduce")])
    a = audit.read("gloo")
    assert a.state.startswith("wrapped: the flight recorder kept its last 2 of 7") and a.ops == []


def test_off_and_empty(monkeypatch):
    with_dump(monkeypatch, [])
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    assert audit.read("gloo").state.startswith("off: ")
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    assert audit.read("gloo").state.startswith("empty: ")


def test_an_unreadable_dump_is_a_state(monkeypatch):
    def boom(backend):
        raise RuntimeError("no recorder here")

    monkeypatch.setattr(audit, "_dump", boom)
    assert audit.read("gloo").state == "unreadable: RuntimeError: no recorder here"


class _Probe:
    default_group = None

    def __init__(self):
        import threading

        self.pushed = []
        self.pushed_event = threading.Event()
        self.health = None

    def push(self, ev):
        self.pushed.append(ev)
        self.pushed_event.set()


def test_a_long_op_reads_the_recorder_off_the_callers_thread_one_read_at_a_time(monkeypatch):
    import threading

    readers, release = [], threading.Event()

    def slow_dump(backend):
        readers.append(threading.get_ident())
        release.wait(5)
        return json.dumps({"version": "2.10", "entries": [entry(0, "gloo:barrier")]})

    monkeypatch.setattr(audit, "_dump", slow_dump)
    probe = _Probe()
    a = audit.Auditor(probe)
    a.soon()
    a.soon()  # while the first read runs: not a second one
    release.set()
    assert probe.pushed_event.wait(5)
    assert readers and threading.get_ident() not in readers and len(readers) == 1
    assert probe.pushed[0].ops[0].op == "barrier"

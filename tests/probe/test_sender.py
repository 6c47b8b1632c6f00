"""The sender thread's delivery rules, with a fake client: nothing is lost while a
watcher is late, reconnecting watchers are told who we are, overflow is counted,
and CUDA-style completions are polled, never waited on."""

import collections

from commviz.events import Goodbye, GroupDef, Hello, OpStart, decode_batch
from commviz.probe import sender as sender_mod
from commviz.probe.health import Health
from commviz.probe.sender import END, START, Sender
from tests.helpers import hello


class FakeClient:
    def __init__(self):
        self.up = False
        self.frames = []

    def send(self, payload):
        if not self.up:
            return False
        self.frames.append(decode_batch(payload))
        return True

    def close(self):
        pass


def make_sender(tmp_path=None):
    q = collections.deque()
    s = Sender(0, hello(0), None, str(tmp_path) if tmp_path else None, Health(), q)
    s.client = FakeClient()
    return s, q


def start(q, op_id, t=0):
    q.append((START, op_id, t, "all_reduce", "0", op_id, 64, "float32", [16], -1, -1, False, "SUM"))


def events(client):
    return [(type(e).__name__, getattr(e, "id", None)) for f in client.frames for e in f.events]


def test_late_watcher_gets_resync_then_the_whole_backlog_in_order():
    s, q = make_sender()
    q.append(GroupDef("0", [0, 1], "gloo"))
    for i in range(3):
        start(q, i)
        q.append((END, i, 10, "", -1, -1))
    start(q, 3)  # still in flight
    s.flush()
    assert s.client.frames == [] and s.backlog_events > 0
    s.client.up = True
    s.flush()
    got = events(s.client)
    # first a resync (hello, groups, what is in flight), then everything in order
    assert got[:3] == [("Hello", None), ("GroupDef", None), ("OpStart", 3)]
    ops = [e for e in got[3:] if e[0] in ("OpStart", "OpEnd")]
    assert ops == [("OpStart", 0), ("OpEnd", 0), ("OpStart", 1), ("OpEnd", 1), ("OpStart", 2), ("OpEnd", 2), ("OpStart", 3)]
    assert s.health.dropped == 0


def test_backlog_is_bounded_and_overflow_is_counted(monkeypatch):
    monkeypatch.setattr(sender_mod, "BACKLOG_EVENTS", 10)
    s, q = make_sender()
    for i in range(20):
        start(q, i)
        s.flush()
    assert s.backlog_events <= 10 + 2
    assert s.health.dropped >= 8


def test_goodbye_counts_what_never_reached_a_watcher(tmp_path):
    s, q = make_sender(tmp_path)
    for i in range(5):
        start(q, i)
    s.stop()
    from commviz.trace.file import load

    evs = [e for b in load(tmp_path / "rank-0.cvz").batches for e in b.events]
    assert isinstance(evs[0], Hello)
    bye = evs[-1]
    assert isinstance(bye, Goodbye) and bye.dropped >= 5
    assert sum(isinstance(e, OpStart) for e in evs) == 5  # the trace has them all


def test_polled_completion_is_stamped_when_the_event_reports_done():
    s, q = make_sender()
    state = {"done": False}
    s.add_poll(9, lambda: (state["done"], ""), nbytes=123)
    s._poll()
    assert not q
    state["done"] = True
    s._poll()
    [(kind, op_id, t, err, nbytes, peer)] = q
    assert (kind, op_id, err, nbytes) == (END, 9, "", 123)
    assert s.polls == []


def test_a_poll_that_raises_ends_the_op_with_the_error():
    s, q = make_sender()

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access")

    s.add_poll(4, broken)
    s._poll()
    [(kind, op_id, t, err, nbytes, peer)] = q
    assert op_id == 4 and "illegal memory access" in err


def test_unwritable_trace_dir_warns_once_and_goes_on(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("not a directory")
    q = collections.deque()
    s = Sender(0, hello(0), None, str(f / "sub"), Health(), q)
    assert s.trace is None and s.health.trace_errors == 1
    assert "cannot write the trace" in capsys.readouterr().err


def test_disk_full_mid_run_warns_once_and_the_job_goes_on(tmp_path, capsys):
    import errno

    s, q = make_sender(tmp_path)
    calls = []

    def full(payload):
        calls.append(len(payload))
        raise OSError(errno.ENOSPC, "No space left on device")

    s.trace.write = full
    for i in range(3):
        start(q, i)
        s.flush()
    err = capsys.readouterr().err
    assert err.count("trace write failed") == 1 and "No space left" in err
    assert s.health.trace_errors == 1 and s.trace is None and len(calls) == 1

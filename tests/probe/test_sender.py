"""The sender thread's delivery rules, with a fake client: nothing is lost while a
watcher is late, reconnecting watchers are told who we are, overflow is counted.
CUDA completions are polled on their own thread: tests/probe/test_cuda.py."""

import collections
import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commviz.events import Goodbye, GroupDef, Hello, OpStart, decode_batch
from commviz.probe import sender as sender_mod
from commviz.probe.health import Health
from commviz.events import END, START
from commviz.probe.sender import Sender
from commviz.transport.credit import Window
from tests.helpers import FakeClock, hello


class FakeClient:
    """A watcher behind the real credit window (transport/credit.py). "up" takes every
    frame and acks it by the next poll; "frozen" keeps what it is handed unacknowledged
    (up to the window, as a SIGSTOPped watcher's zmq queue would); "down" has no
    connection: a send fails, and frames a frozen watcher held are lost with it."""

    def __init__(self, window: int = 4):
        self.window = Window(window)
        self.state = "down"
        self.frames = []  # what reached the watcher, in order
        self.held = []  # taken by a frozen watcher, not yet read
        self.acks = 0
        self.cut = False

    @property
    def room(self):
        return self.window.room

    def set(self, state: str) -> None:
        if self.state == "frozen" and state == "up":  # it wakes and reads what it held
            self.frames += self.held
            self.acks += len(self.held)
            self.held = []
        if state == "down" and self.state != "down":  # the connection drops, and what it held
            self.held, self.cut = [], True
        self.state = state

    @property
    def up(self):
        return self.state == "up"

    @up.setter
    def up(self, on: bool):
        self.set("up" if on else "down")

    def writable(self):
        return self.state != "down"

    def send(self, payload, tag=None):
        if self.state == "down":
            return False
        self.window.sent(tag)
        if self.state == "up":
            self.frames.append(decode_batch(payload))
            self.acks += 1
        else:
            self.held.append(decode_batch(payload))
        return True

    def poll(self):
        self.window.ack(self.acks)  # acks that came before the drop was seen
        self.acks = 0
        if self.cut:
            self.cut = False
            return self.window.lose()
        return None

    def close(self):
        pass


def make_sender(tmp_path=None, clock=None):
    """On a stopped clock (one the test may step): a flush emits counters once, and the
    exit's waits for ops still in flight and for a watcher run their course at once."""
    q = collections.deque()
    clock = clock or FakeClock()
    s = Sender(0, hello(0), None, str(tmp_path) if tmp_path else None, Health(), q, clock=clock, sleep=clock.sleep)
    s.client = FakeClient()
    s.resync_every_s = 0  # every flush asks the (fake) socket; the pause has its own test
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


def test_with_no_watcher_the_socket_is_asked_again_only_after_a_pause_and_at_once_at_exit(clock):
    """A flush that found nobody listening, with no frame of its own out, leaves the
    socket alone for resync_every_s (asking costs a few µs a flush; zmq retries the
    connection only every 0.1-0.5 s anyway); then the watcher gets its resync and the
    backlog in order, nothing lost. At exit it is asked at once."""
    s, q = make_sender(clock=clock)
    s.resync_every_s = 0.3
    polls = []
    poll = s.client.poll
    s.client.poll = lambda: polls.append(1) or poll()
    start(q, 0)
    q.append((END, 0, 10, "", -1, -1))
    s.flush()
    assert len(polls) == 1 and s.client.frames == []
    s.client.up = True
    start(q, 1)
    q.append((END, 1, 20, "", -1, -1))
    s.flush()
    assert len(polls) == 1 and s.client.frames == []  # not asked again yet
    clock.tick(0.3)
    s.flush()
    assert len(polls) == 2 and [e for e in events(s.client) if e[0] != "Counters"][:1] == [("Hello", None)]
    assert [e for e in events(s.client) if e[0] in ("OpStart", "OpEnd")] == [
        ("OpStart", 0), ("OpEnd", 0), ("OpStart", 1), ("OpEnd", 1)]

    s2, q2 = make_sender(clock=clock)
    s2.resync_every_s = 60
    s2.flush()  # nobody: not asked again for a minute
    s2.client.up = True
    start(q2, 7)
    q2.append((END, 7, 10, "", -1, -1))
    s2.stop()
    got = events(s2.client)
    assert got[0] == ("Hello", None) and ("OpEnd", 7) in got and got[-1][0] == "Goodbye"
    assert s.health.dropped == s2.health.dropped == 0


def spy_emit(s) -> list:
    """Every event the sender emits from now on (no trace: all of it is streamed or lost)."""
    out = []
    emit = s._emit
    s._emit = lambda evs: out.extend(evs) or emit(evs)
    return out


def delivered(client) -> int:
    """Events that reached the watcher, resyncs (frames opening with a hello) aside."""
    return sum(len(f.events) for f in client.frames if not (f.events and isinstance(f.events[0], Hello)))


def test_backlog_is_bounded_and_overflow_is_counted_exactly(monkeypatch):
    monkeypatch.setattr(sender_mod, "BACKLOG_EVENTS", 10)
    s, q = make_sender()
    emitted = spy_emit(s)
    for i in range(20):
        start(q, i)
        s.flush()
    # 20 starts and the first flush's counters: the newest 10 wait, the 11 oldest are dropped
    assert len(emitted) == 21
    assert (s.backlog_events, s.health.dropped) == (10, 11)
    s.client.up = True
    for _ in range(4):  # a window of frames a flush, each acked by the next
        s.flush()
    assert s.backlog_events == 0 and delivered(s.client) == 10
    assert [e[1] for e in events(s.client) if e[0] == "OpStart"][-10:] == list(range(10, 20))


def test_events_left_out_while_a_watcher_takes_none_say_it_is_behind(tmp_path, monkeypatch):
    """Left out with no watcher connected: nobody is behind. Left out while one is
    connected but takes nothing (its window full): it is behind, and its counters say
    by how many events, traced or not (the trace keeps them, the live view lost them),
    so it sheds detail instead of showing holed collectives."""
    monkeypatch.setattr(sender_mod, "BACKLOG_EVENTS", 10)
    monkeypatch.setattr(sender_mod, "COUNTERS_EVERY_S", 0.0)
    s, q = make_sender(tmp_path)
    emitted = spy_emit(s)
    for i in range(20):
        start(q, i)
        s.flush()
    assert s.health.behind == 0 and s.backlog_events == 10  # no watcher: ten left out, not "behind"
    s.client.set("up")
    s.flush()
    s.client.set("frozen")
    for i in range(20, 60):
        start(q, i)
        s.flush()
    assert s.health.dropped == 0  # all in the trace
    assert s.health.behind >= 40 - 10 - 4  # less what waits in the backlog and the window
    told = [e.behind for e in emitted if type(e).__name__ == "Counters"]
    assert told[0] == 0 and 0 < told[-1] <= s.health.behind  # (a flush tells before it trims)


STATES = st.sampled_from(["up", "frozen", "down"])
STEP = st.tuples(st.integers(0, 40), STATES)


def held(client) -> int:
    return sum(len(f.events) for f in client.held if not (f.events and isinstance(f.events[0], Hello)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEP, max_size=25), at_exit=STATES)
def test_every_event_is_delivered_dropped_or_waiting(monkeypatch, steps, at_exit):
    """No trace: produced = delivered + dropped + backlog + held by a frozen watcher
    after every flush, whatever the watcher does (comes, freezes, wakes, goes); and the
    goodbye says exactly how many events before it no watcher got."""
    monkeypatch.setattr(sender_mod, "BACKLOG_EVENTS", 25)
    monkeypatch.setattr(sender_mod, "MAX_BATCH", 7)
    monkeypatch.setattr(sender_mod, "EXIT_GRACE_S", 0.0)  # these starts never end
    monkeypatch.setattr(sender_mod, "EXIT_HANDOVER_S", 0.0)
    s, q = make_sender()
    emitted = spy_emit(s)
    op_id = 0
    for n, state in steps:
        for _ in range(n):
            start(q, op_id)
            op_id += 1
        s.client.set(state)
        s.flush()
        assert len(emitted) == delivered(s.client) + s.health.dropped + s.backlog_events + held(s.client)
        assert len(s.client.window) <= s.client.window.size
    s.client.set(at_exit)
    s.stop()
    bye = emitted[-1]
    assert isinstance(bye, Goodbye)
    got = delivered(s.client)
    if at_exit == "up":
        assert s.client.frames[-1].events[-1] == bye  # it arrived, and with it everything before it
        assert bye.dropped == len(emitted) - got == s.health.dropped
    elif at_exit == "frozen":
        # handed over past a full window, so a watcher that wakes gets it
        assert s.client.held[-1].events[-1] == bye
        assert got + held(s.client) + bye.dropped == len(emitted)
    else:
        assert got + bye.dropped == len(emitted) - 1  # what no watcher got before the goodbye
        assert s.health.dropped == bye.dropped + 1  # and the goodbye itself


def test_a_full_window_keeps_the_rest_in_the_backlog_and_acks_release_it(monkeypatch):
    """A frozen watcher holds at most the window; the sender keeps the rest, and sends
    it, in order, once the watcher acks what it held."""
    s, q = make_sender()
    s.client.set("frozen")
    for i in range(10):
        start(q, i)
        s.flush()
    assert len(s.client.held) == s.client.window.size  # a resync and 3 frames
    assert s.backlog_events >= 10 - 3 and s.health.dropped == 0
    s.client.set("up")
    for _ in range(4):
        s.flush()
    assert s.backlog_events == 0
    streamed = [e.id for f in s.client.frames if not isinstance(f.events[0], Hello) for e in f.events
                if isinstance(e, OpStart)]
    assert streamed == list(range(10))


def test_a_watcher_that_goes_away_costs_exactly_what_it_had_not_acked(monkeypatch):
    s, q = make_sender()
    emitted = spy_emit(s)
    s.client.set("frozen")
    for i in range(6):
        start(q, i)
        s.flush()
    in_window = held(s.client)
    assert len(s.client.held) == s.client.window.size and in_window >= 3  # a resync, 3 frames
    s.client.set("down")
    s.flush()
    assert s.health.dropped == in_window  # only what the window held; the backlog waits
    s.client.set("up")
    for _ in range(3):
        s.flush()
    assert s.client.frames[0].events[0] == s.hello  # the new watcher is told who we are
    assert len(emitted) == delivered(s.client) + s.health.dropped


def _trace_events(path):
    from commviz.trace.file import load

    return [e for b in load(path).batches for e in b.events]


def test_with_a_trace_and_no_watcher_nothing_is_dropped(tmp_path):
    """Events the trace holds are not lost: `dropped` stays 0 though none streamed."""
    s, q = make_sender(tmp_path)
    for i in range(5):
        start(q, i)
    s.flush()
    for i in range(5, 8):
        start(q, i)
    s.stop()
    evs = _trace_events(tmp_path / "rank-0.cvz")
    assert isinstance(evs[0], Hello)
    assert sum(isinstance(e, OpStart) for e in evs) == 8  # the trace has them all
    bye = evs[-1]
    assert isinstance(bye, Goodbye) and bye.dropped == 0
    assert s.health.dropped == 0
    assert all(e.dropped == 0 for e in evs if type(e).__name__ == "Counters")


def test_backlog_overflow_with_a_trace_is_not_dropped(tmp_path, monkeypatch):
    monkeypatch.setattr(sender_mod, "BACKLOG_EVENTS", 10)
    s, q = make_sender(tmp_path)
    for i in range(20):
        start(q, i)
        s.flush()
    # 20 starts and the first flush's counters; the 11 oldest left the backlog, but the trace has them
    assert (s.backlog_events, s.health.dropped) == (10, 0)


def test_goodbye_counts_what_reached_neither_a_watcher_nor_a_trace():
    s, q = make_sender()
    emitted = []
    emit = s._emit
    s._emit = lambda evs: emitted.extend(evs) or emit(evs)
    for i in range(5):
        start(q, i)
    s.flush()  # in the backlog: a watcher may still come, nothing is lost yet
    assert s.health.dropped == 0
    start(q, 5)
    s.stop()
    assert s.client.frames == []
    byes = [e for e in emitted if isinstance(e, Goodbye)]
    assert len(byes) == 1 and byes[0].dropped == len(emitted) - 1  # every event before it
    assert s.health.dropped == len(emitted)  # and the goodbye itself


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


def test_a_host_topology_stamps_its_frame_and_the_resync_with_schema_2():
    """A reader of schema 1 keeps reading this rank's op frames until the sampler
    thread queues the host's topology (a schema-2 kind); from then on it is told to
    upgrade rather than fed a frame it cannot decode."""
    from commviz.events import HOST_TOPOLOGY_SINCE, HostTopology

    s, q = make_sender()
    s.client.up = True
    start(q, 0)
    s.flush()
    assert [f.schema for f in s.client.frames] == [1, 1]  # resync, then the op
    q.append(HostTopology(1, "node0", {"gpus": []}))
    s.flush()
    assert s.client.frames[-1].schema == HOST_TOPOLOGY_SINCE
    assert any(isinstance(e, HostTopology) for e in s.client.frames[-1].events)
    s.connected = False  # a reconnecting watcher gets the topology again, stamped for it
    start(q, 1)
    s.flush()
    resync = s.client.frames[-2]
    assert resync.schema == HOST_TOPOLOGY_SINCE and isinstance(resync.events[-1], HostTopology)


def test_frames_stay_under_the_wire_limit_and_an_event_too_big_for_any_is_counted(capsys):
    """A watcher takes frames of at most MAX_WIRE_FRAME (it closes a connection that
    sends more): a big run goes as several frames, in order; one event bigger than
    that is left out, counted and said once."""
    from commviz.events import MAX_WIRE_FRAME

    s, q = make_sender()
    s.client.up = True
    emitted = spy_emit(s)
    for i in range(4000):
        q.append((START, i, i, "all_reduce", "0", i, 64, "float32", list(range(8)), -1, -1, False, "SUM"))
    q.append(GroupDef("huge", list(range(100_000)), "gloo"))
    for _ in range(8):
        s.flush()
    streamed = [f for f in s.client.frames if not isinstance(f.events[0], Hello)]
    assert len(streamed) > 1
    assert [e.id for f in streamed for e in f.events if isinstance(e, OpStart)] == list(range(4000))
    assert s.health.dropped == 1 and len(emitted) == delivered(s.client) + 1
    assert capsys.readouterr().err.count(f"an event over {MAX_WIRE_FRAME >> 10} KiB") == 1


@pytest.mark.native
def test_the_c_drain_leaves_what_the_python_drain_leaves(monkeypatch):
    """The sender's loop over what it pops (probe/_fastwrap.c's drain, where built):
    the same records out, each deferred start with its tensor's fields, the same ops
    in flight, groups and topology kept, whatever the mix."""
    import copy

    import torch

    from commviz.events import HOST_TOPOLOGY_SINCE, Counters, HostTopology, end_record, start_record

    assert sender_mod._c_drain is not None, "commviz/probe/_fastwrap.c was not built (pip install -e .)"
    a, b = torch.ones(4, 2), torch.zeros(3, dtype=torch.int8)

    def deferred(op_id, x):
        return [START, op_id, 5, "all_reduce", "0", op_id, x, "", (), -1, -1, False, "SUM"]

    def mix():
        return [deferred(0, a), GroupDef("g1", [0, 1], "gloo"), deferred(1, b), deferred(2, a),
                end_record(0, 9), start_record(3, 6, "send", "0", 0, 8, "int8", [8], peer=1),
                Counters(7, 0, 0, 0), end_record(3, 10), end_record(99, 11),  # an end whose start went before
                HostTopology(1, "node0", {"gpus": []}), deferred(4, a), end_record(2, 12),
                deferred(5, b), end_record(5, 13),  # blocking ops: the start, then its own end
                start_record(6, 7, "send", "0", 1, 8, "int8", [8], peer=1), end_record(6, 14),
                deferred(7, a), end_record(4, 15)]  # a start, then another op's end

    def drained(c_drain):
        monkeypatch.setattr(sender_mod, "_c_drain", c_drain)
        s, q = make_sender()
        s.inflight[99] = ("start", 99)
        s.inflight[5] = ("start", 5)  # in flight already (a resync's): its start and end below take it out
        q.extend(mix())
        out = s._drain()
        return ([copy.copy(r) if isinstance(r, list) else r for r in out], dict(s.inflight), s.groups,
                s.topology, s.schema)

    c, py = drained(sender_mod._c_drain), drained(None)
    assert c == py
    out, inflight, groups, topology, schema = c
    assert out[0][6:9] == [32, "float32", torch.Size([4, 2])] and out[2][6:9] == [3, "int8", torch.Size([3])]
    assert sorted(inflight) == [1, 7] and [g.group for g in groups] == ["g1"]
    assert out[12][6:9] == [3, "int8", torch.Size([3])] and len(out) == 18
    assert topology.host == "node0" and schema == HOST_TOPOLOGY_SINCE


@pytest.mark.parametrize("c_drain", [True, False])
def test_a_rank_that_starts_no_op_for_a_while_sends_its_threads_stacks_then_less_often(monkeypatch, c_drain):
    """Issue 30: the rank a hang waits for is often in no op at all. Quiet for the
    stack threshold: its stacks go out once; again when the quiet has doubled; any
    op re-arms it."""
    if not c_drain:
        monkeypatch.setattr(sender_mod, "_c_drain", None)
    s, q = make_sender()
    s.stack_after_ns = int(3e9)
    taken = []
    s.on_quiet = lambda: taken.append(1) or []
    start(q, 1)
    s.flush()
    s._capture_if_quiet(100.0)  # an op was drained: active at 100 s
    for now in (101.0, 102.9):
        s._capture_if_quiet(now)
    assert taken == []
    s._capture_if_quiet(103.0)  # 3 s quiet
    assert len(taken) == 1
    for now in (104.0, 105.9):
        s._capture_if_quiet(now)
    assert len(taken) == 1
    s._capture_if_quiet(106.1)  # 6 s quiet: again, next at 12 s
    assert len(taken) == 2
    s._capture_if_quiet(111.0)
    assert len(taken) == 2
    start(q, 2)
    s.flush()
    s._capture_if_quiet(111.5)  # an op: re-armed, nothing taken
    s._capture_if_quiet(113.0)
    assert len(taken) == 2
    s._capture_if_quiet(114.6)
    assert len(taken) == 3


def test_an_op_in_flight_past_the_threshold_has_its_callers_stack_taken_once(clock):
    """What a hang diagnosis shows as the line at fault: taken when the op has been in
    flight for the stack threshold, not before, and once however long it stays."""
    s, q = make_sender(clock=clock)
    s.stack_after_ns = int(3e9)
    taken = []
    s.on_long_op = lambda op_id: taken.append(op_id)
    start(q, 1, t=int(clock() * 1e9))
    start(q, 2, t=int((clock() + 1.0) * 1e9))
    s.flush()
    clock.tick(2.5)
    s._capture_long_ops()
    assert taken == []
    clock.tick(0.5)  # op 1: 3 s in flight
    s._capture_long_ops()
    assert taken == [1]
    clock.tick(60.0)
    s._capture_long_ops()
    assert taken == [1, 2]


def test_quiet_stacks_are_every_thread_but_commvizs_main_first():
    import threading

    from commviz.probe.stacks import all_threads

    stop = threading.Event()
    workers = [threading.Thread(target=stop.wait, name=n, daemon=True) for n in ("loader", "commviz-sender-x")]
    for w in workers:
        w.start()
    got = []
    t = threading.Thread(target=lambda: got.extend(all_threads()), name="commviz-sender")
    t.start()
    t.join()
    stop.set()
    names = [n for n, _ in got]
    assert names[0] == "MainThread" and "loader" in names
    assert not any(n.startswith("commviz") for n in names)

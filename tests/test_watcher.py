"""The live feed: every bad frame reaches the model's count and the status line though
each peer is described at most once a second; shed frames are shown by peer; its own
writes into a trace (the stop marker); refused peers are counted in the status line;
a rank that dies on this host is dead in ~0.5 s."""

import os
import pytest
import signal
import socket
import subprocess
import sys
import time

import zmq

from commviz.events import Goodbye, Stopped, encode_batch
from commviz.trace.file import load
from commviz.transport.client import Client
from commviz.watcher import LiveFeed
from tests.helpers import hello
from tests.helpers import wait_for


def test_every_bad_frame_is_counted_though_described_once(tmp_path):
    d = tmp_path / "commviz-t"
    d.mkdir(mode=0o700)
    feed = LiveFeed(f"ipc://{d}/w.sock").start()
    # Describing a peer also closes its connection, and what was still in flight on
    # it is gone: nobody read it, so nobody can count it. The first frame is the one
    # described; the rest come on the connection zmq opens again, inside a quiet
    # period long enough for a loaded machine.
    feed.server.rejected.say_every_s = 60.0
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    try:
        raw.setsockopt(zmq.IDENTITY, b"junk")
        raw.connect(feed.addr)
        raw.send(b"\xc1 garbage")
        assert wait_for(lambda: feed.model.decode_errors == 1 and feed.server.conns.evicted == 1)
        for _ in range(299):
            raw.send(b"\xc1 garbage")
        assert wait_for(lambda: feed.model.decode_errors == 300)
        assert len(feed.errors) == 1 and feed.errors[0].startswith("from junk: undecodable frame")
        assert "300 bad frames" in feed.status()
    finally:
        raw.close(0)
        ctx.term()
        feed.close()


@pytest.mark.native
def test_the_status_line_says_when_bad_frames_are_read_the_slow_way(tmp_path):
    d = tmp_path / "commviz-t"
    d.mkdir(mode=0o700)
    feed = LiveFeed(f"ipc://{d}/w.sock").start()
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    try:
        assert feed.server.reads_in_c  # as CI builds it: no hint
        raw.connect(feed.addr)
        raw.send(b"\xc1 garbage")
        assert wait_for(lambda: feed.server.bad_frames == 1)
        assert "pyzmq" not in feed.status()
        feed.server.reads_in_c = False  # an install that could not build the C reader
        assert "read through pyzmq, a third as fast: reinstall commviz where a C compiler is" in feed.status()
    finally:
        raw.close(0)
        ctx.term()
        feed.close()


def test_shed_frames_are_shown_by_peer(tmp_path):
    d = tmp_path / "commviz-t"
    d.mkdir(mode=0o700)
    feed = LiveFeed(f"ipc://{d}/w.sock")
    feed.server._inbox.max_bytes = 1  # the model is always behind: all but the first are shed
    feed.lock.acquire()  # ...because the dashboard holds the model
    feed.start()
    try:
        c = Client(feed.addr, identity=b"rank2-pid7")
        frame = encode_batch(2, [hello(2)])
        assert wait_for(lambda: c.send(frame))
        for _ in range(20):
            c.send(frame)
        assert wait_for(lambda: feed.server.shed_frames >= 19)
        assert f"{feed.server.shed_frames} frames shed (rank2-pid7 {feed.server.shed_frames})" in feed.status()
        c.close()
    finally:
        feed.lock.release()
        feed.close()
    # frames the inbox had no room for leave collectives holed: the model sheds
    # detail, and says so
    assert feed.server.behind_frames == feed.server.shed_frames
    assert feed.model.shed and "frames lost: shedding detail" in feed.status()
    # and a script asking the collector's summary (`summary --live --json`) is told
    from commviz.httpview import StateServer, fetch_summary

    http = StateServer(feed, "127.0.0.1", 0).start()
    try:
        ingest = fetch_summary(f"{http.url}/summary")["ingest"]
    finally:
        http.close()
    assert ingest["shedding"] and ingest["why"] == "frames lost" and ingest["shed_frames"] >= 19


def test_a_probe_saying_the_watcher_is_behind_makes_it_shed(tmp_path):
    """Frames a probe left out while connected (its credit window full) never reach
    the inbox: the probe's counters say how many, and the model sheds detail as for
    frames the inbox shed, instead of showing every collective holed."""
    from commviz.events import Counters

    d = tmp_path / "commviz-t"
    d.mkdir(mode=0o700)
    feed = LiveFeed(f"ipc://{d}/w.sock")
    feed.start()
    try:
        c = Client(feed.addr, identity=b"rank3-pid9")
        assert wait_for(lambda: c.send(encode_batch(3, [hello(3, mono=time.monotonic_ns(), wall=time.time_ns()), Counters(time.monotonic_ns())])))
        assert wait_for(lambda: 3 in feed.model.ranks)
        assert not feed.model.shed
        c.send(encode_batch(3, [Counters(time.monotonic_ns(), behind=700)]))
        c.send(encode_batch(3, [Counters(time.monotonic_ns(), behind=700)]))  # a total: not counted twice
        assert wait_for(lambda: feed.model.behind_events == 700 and feed.model.shed)
        assert "frames lost: shedding detail" in feed.status()
        assert "700 events left out by the probes" in feed.status()
        c.close()
        from commviz import metrics
        from commviz.httpview import StateServer, fetch_summary

        http = StateServer(feed, "127.0.0.1", 0).start()
        try:
            ingest = fetch_summary(f"{http.url}/summary")["ingest"]
        finally:
            http.close()
        assert ingest["probe_behind_events"] == 700 and ingest["why"] == "frames lost"
        told = {s.name: s.value for fam in metrics.feed_collector(feed).collect() for s in fam.samples}
        assert told["commviz_ingest_probe_behind_events_total"] == 700
        assert ingest["read_pauses"] == told["commviz_ingest_read_pauses_total"] == 0  # its queue was never full
        feed.server.paused = 3  # as a reader that waited for room three times says it
        told = {s.name: s.value for fam in metrics.feed_collector(feed).collect() for s in fam.samples}
        assert told["commviz_ingest_read_pauses_total"] == 3
        assert "reading paused 3 times (the model's queue full" in feed.status()
    finally:
        feed.close()


def test_note_stop_marks_every_running_rank_in_its_own_clock(tmp_path):
    sock = tmp_path / "sock"
    sock.mkdir(mode=0o700)
    feed = LiveFeed(f"ipc://{sock}/w.sock", record_to=str(tmp_path / "t.cvz")).start()
    try:
        now = time.time_ns()
        with feed.lock:
            # rank 0's monotonic clock reads 5 s at wall `now`; rank 1 already exited
            feed.model.ingest(0, hello(0, mono=5 * 10**9, wall=now))
            feed.model.ingest(1, hello(1, wall=now))
            feed.model.ingest(1, Goodbye(10))
        before = time.time_ns()
        feed.note_stop("commviz record", "hang", 3.0)
        after = time.time_ns()
    finally:
        feed.close()
    [b] = load(tmp_path / "t.cvz").batches
    assert (b.schema, b.rank) == (2, 0)  # an older reader says "upgrade", and reads the rest
    [st] = b.events
    assert isinstance(st, Stopped) and (st.by, st.reason, st.after_s) == ("commviz record", "hang", 3.0)
    assert before - now <= st.t - 5 * 10**9 <= after - now  # wall time in rank 0's monotonic clock
    assert feed.model.ranks[0].stopped == st and feed.model.ranks[1].stopped is None


def test_the_status_line_counts_peers_refused_for_want_of_the_token():
    feed = LiveFeed("tcp://127.0.0.1:0", token="s3cret").start()
    clients = []
    try:
        assert "refused" not in feed.status()
        for ident, token in ((b"anon", ""), (b"intruder", "wrong")):  # none at all, and a wrong one
            c = Client(feed.addr, identity=ident, token=token)
            clients.append(c)
            c.send(encode_batch(1, [hello(1)]))
            n = feed.server.denied
            assert wait_for(lambda: feed.server.denied > n)
        good = Client(feed.addr, identity=b"rank0", token="s3cret")
        clients.append(good)
        assert wait_for(lambda: good.send(encode_batch(0, [hello(0)])))
        assert wait_for(lambda: "1 ranks" in feed.status())
        status = feed.status()
        assert f"{feed.server.denied} connections refused (no valid token)" in status, status
        assert feed.server.denied >= 2
    finally:
        for c in clients:
            c.close()
        feed.close()


def test_the_status_line_counts_connections_refused_for_being_one_too_many(tmp_path):
    """A real flood of connections: past the cap each new one is refused and the status
    line says how many, and what the cap is."""
    import zmq

    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    feed = LiveFeed(f"ipc://{d}/w.sock")
    feed.server.conns.max_open = 2
    feed.start()
    ctx = zmq.Context()
    socks = []
    try:
        for i in range(4):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(feed.addr)
            socks.append(s)
        assert wait_for(lambda: feed.server.turned_away >= 2, timeout=20)
        assert f"{feed.server.turned_away} connections refused (over 2 at once)" in feed.status()
    finally:
        for s in socks:
            s.close()
        ctx.term()
        feed.close()


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def dead_after(feed: LiveFeed, rank: int, proc: subprocess.Popen) -> float:
    """Seconds from SIGKILL to the rank marked dead."""
    os.kill(proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    assert wait_for(lambda: feed.model.ranks[rank].status == "dead", timeout=10), "never marked dead"
    return time.monotonic() - t0


def test_a_rank_that_dies_on_this_host_is_dead_within_about_half_a_second(tmp_path):
    """Two ranks; the second is killed the moment the first is seen dead, right after
    a liveness pass, so its delay is the whole pass interval: the worst case."""
    d = tmp_path / "sock"
    d.mkdir(mode=0o700)
    feed = LiveFeed(f"ipc://{d}/w.sock").start()
    procs = [sleeper(), sleeper()]
    try:
        host = socket.gethostname()
        with feed.lock:
            for r, p in enumerate(procs):
                feed.model.ingest(r, hello(r, pid=p.pid, host=host))
        first = dead_after(feed, 0, procs[0])
        worst = dead_after(feed, 1, procs[1])
        print(f"dead after {first * 1000:.0f} ms, then {worst * 1000:.0f} ms (just after a pass)")
        assert worst < 1.2  # ~0.5 s promised; slack for a loaded box, not for a slower pass
        assert feed.model.ranks[1].status == "dead" and feed.model.ranks[0].status == "dead"
    finally:
        for p in procs:
            p.kill()
            p.wait()
        feed.close()

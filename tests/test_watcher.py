"""The live feed's counts: every bad frame reaches the model's count and the status
line though each peer is described at most once a second; shed frames are shown by peer.
Its own writes into a trace: the stop marker."""

import time

import zmq

from commviz.events import Goodbye, Stopped, encode_batch
from commviz.trace.file import load
from commviz.transport.client import Client
from commviz.watcher import LiveFeed
from tests.helpers import hello
from tests.transport.test_server import wait_for


def test_every_bad_frame_is_counted_though_described_once(tmp_path):
    d = tmp_path / "commviz-t"
    d.mkdir(mode=0o700)
    feed = LiveFeed(f"ipc://{d}/w.sock").start()
    ctx = zmq.Context()
    try:
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.IDENTITY, b"junk")
        raw.connect(feed.addr)
        for _ in range(300):
            raw.send(b"\xc1 garbage")
        assert wait_for(lambda: feed.model.decode_errors == 300)
        assert len(feed.errors) == 1 and feed.errors[0].startswith("from junk: undecodable frame")
        assert "300 bad frames" in feed.status()
        raw.close(0)
    finally:
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

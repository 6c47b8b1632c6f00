"""Through the real client and server: a watcher receiving events stamped long ago
says how far behind it is, and sheds detail."""

import time

from commviz.events import encode_batch
from commviz.transport.client import Client
from commviz.watcher import LiveFeed
from tests.helpers import group, hello, op
from tests.helpers import wait_for


def test_status_line_says_how_far_behind_and_that_detail_is_shed(tmp_path):
    d = tmp_path / "w"
    d.mkdir(mode=0o700)
    feed = LiveFeed(f"ipc://{d}/w.sock").start()
    try:
        c = Client(feed.addr, identity=b"rank0")
        now_mono = time.monotonic_ns()
        # this host's clock: mono now == wall now; the events were made 30 s ago
        h = hello(0, world=1, mono=now_mono, wall=time.time_ns())
        old = now_mono - 30_000_000_000
        assert wait_for(lambda: c.send(encode_batch(0, [h, group(ranks=(0,)), *op(0, old, old + 1000)])))
        assert wait_for(lambda: feed.model.events == 4)
        st = feed.status()
        lag = feed.overload.lag_ns / 1e9
        assert 29 < lag < 60 and f"lag {lag:.1f} s, behind the job: shedding detail" in st
        assert feed.model.shed
        fresh = time.monotonic_ns()
        assert wait_for(lambda: c.send(encode_batch(0, op(1, fresh, fresh + 1000, seq=1))))
        assert wait_for(lambda: feed.model.events == 6)
        assert not feed.model.shed and "shedding" not in feed.status()  # caught up
        assert feed.model.summary()["ops"][0]["count"] == 2
        c.close()
    finally:
        feed.close()

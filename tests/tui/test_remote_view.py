"""The dashboard as a client of a collector (commviz/viewlink.py): what a view over
HTTP shows is what the embedded dashboard shows, several views share one collector,
and a collector that goes away or answers something else is said, not a crash."""

from __future__ import annotations

import os
import pickle
import threading
import time

import pytest
from textual.widgets import DataTable, Static

from commviz.errors import CommvizError
from commviz.events import GroupDef, OpEnd, OpStart
from commviz.httpview import StateServer
from commviz.tui.app import WatchApp
from commviz.view.snapshot import Fetched
from commviz.viewlink import PROTOCOL, RemoteFeed, ViewError, ViewHello, ViewQuery, ViewSource, decode, encode

from .helpers import MS, WALL0, hello
from .scenes import FakeFeed


def busy_feed(n_ops: int = 3) -> FakeFeed:
    """Two ranks that finished `n_ops` all_reduces; rank 1 waits in a broadcast."""
    feed = FakeFeed()
    m = feed.model
    for r in (0, 1):
        m.ingest(r, hello(r, mono_ns=WALL0, wall_ns=WALL0))
        m.ingest(r, GroupDef("g0", [0, 1], "gloo"))
    for i in range(n_ops):
        for r in (0, 1):
            t = WALL0 + (10 + 10 * i) * MS
            m.ingest(r, OpStart(id=i, t=t + r * MS, op="all_reduce", group="g0", seq=i, bytes=4096))
            m.ingest(r, OpEnd(id=i, t=t + 4 * MS))
    m.ingest(1, OpStart(id=n_ops, t=WALL0 + 50 * MS, op="broadcast", group="g0", seq=n_ops, bytes=64))
    return feed


@pytest.fixture
def collector():
    feed = busy_feed()
    server = StateServer(feed, "127.0.0.1", 0, views=ViewSource(feed, title="test collector")).start()
    yield feed, server
    server.close()


def test_a_remote_snapshot_is_the_embedded_one(collector):
    feed, server = collector
    remote = RemoteFeed(server.url)
    assert remote.title == "test collector"
    got = remote.fetch(ViewQuery(focus=1))
    here = feed.fetch(ViewQuery(focus=1))
    assert got.snap is not None
    assert got.snap.rank_rows == here.snap.rank_rows
    assert got.snap.op_rows == here.snap.op_rows
    assert [d.message for d in got.snap.diagnoses] == [d.message for d in here.snap.diagnoses]
    assert got.snap.focus == 1 and got.info.nranks == 2
    assert got.status.startswith(f"view of {server.url}")


def test_a_frozen_view_gets_only_the_headline(collector):
    _, server = collector
    got = RemoteFeed(server.url).fetch(ViewQuery(frozen=True))
    assert got.snap is None and got.info.events > 0


def test_several_views_at_once_each_see_everything(collector):
    feed, server = collector
    views = [RemoteFeed(server.url) for _ in range(4)]
    out: list = []

    def look(v: RemoteFeed) -> None:
        for _ in range(5):
            out.append(v.fetch(ViewQuery()).snap.rank_rows)

    ts = [threading.Thread(target=look, args=(v,)) for v in views]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    assert len(out) == 20
    assert all(rows == out[0] for rows in out) and len(out[0]) == 2


def test_a_lost_collector_keeps_the_view_up_and_says_so(collector):
    _, server = collector
    remote = RemoteFeed(server.url, timeout_s=1)
    assert remote.fetch(ViewQuery()).snap is not None
    server.close()
    got = remote.fetch(ViewQuery())
    assert got.snap is None and "collector lost" in got.status and "commviz serve" in got.status
    assert got.info.nranks == 2  # the last headline stays


def test_no_collector_is_a_clear_error():
    with pytest.raises(CommvizError, match="no collector answers.*commviz serve"):
        RemoteFeed("127.0.0.1:9", timeout_s=1)


def test_a_busy_snapshot_crosses_the_wire_whole():
    """Every field of a real snapshot (rows, diagnoses and their alerts, flows,
    places, sparklines) comes back as the type it left as, equal to it."""
    from .scenes import hang, with_p2p

    for feed in (busy_feed(), with_p2p(hang(8, gpu=True), 1, 2)):
        here = feed.fetch(ViewQuery(focus=1))
        assert here.snap.rank_rows and here.snap.op_rows and here.snap.flow.nodes
        got = decode(encode(here), Fetched)
        assert got == here
        assert type(got.snap.rank_rows[0].status) is type(here.snap.rank_rows[0].status)
    assert here.snap.diagnoses and here.snap.alerts and here.snap.rates


def test_an_answer_that_is_not_a_view_is_a_clear_error_never_code_run():
    import os

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    for body in (pickle.dumps(Evil()), pickle.dumps(busy_feed().fetch(ViewQuery())), b"\x80\x05not a pickle",
                 b"", b"\x92\x03\xc1", encode(busy_feed().fetch(ViewQuery()))[:-5]):
        with pytest.raises(ViewError, match="could not be read.*same commviz version"):
            decode(body, Fetched)
    with pytest.raises(ViewError, match="not a Fetched"):
        decode(encode(ViewHello("a hello")), Fetched)


def test_a_collector_of_another_version_is_refused_naming_the_fix():
    import msgspec

    old = msgspec.msgpack.encode((PROTOCOL - 1, {"title": "old"}))
    with pytest.raises(ViewError, match=f"speaks view protocol {PROTOCOL - 1}, this commviz speaks {PROTOCOL}: "
                                        "run the same commviz version on both sides"):
        decode(old, ViewHello)


def test_the_query_says_what_the_view_wants():
    q = ViewQuery(focus=3, frozen=True, simulate=True, summary_unless=-1)
    assert ViewQuery.decode(q.encode()) == q
    assert ViewQuery.decode("focus=x&frozen=0") == ViewQuery(summary_unless=None)


@pytest.mark.asyncio
async def test_the_dashboard_draws_a_remote_collector(collector):
    _, server = collector
    app = WatchApp(RemoteFeed(server.url), title="remote")
    async with app.run_test(size=(100, 30)) as pilot:
        deadline = time.monotonic() + 10
        ranks = app.query_one("#ranks", DataTable)
        while ranks.row_count < 2 and time.monotonic() < deadline:
            await pilot.pause(0.1)
        assert ranks.row_count == 2
        v = ranks.get_cell("1", "op")
        assert getattr(v, "plain", v) == "broadcast#3"
        status = str(app.query_one("#status", Static).render())
        assert f"view of {server.url}" in status and "world 2" in status


@pytest.mark.parametrize("scene", ["hang", "ended", "gpus"])
def test_every_kind_of_snapshot_crosses_the_link(scene):
    """Diagnoses with styled alert rows, an ended job's summary, GPUs on a topology:
    what the view unpickles is what the collector took."""
    from commviz.topo.discover import discover
    from commviz.topo.hosts import HostTopologies
    from commviz.topo.presets import load_preset

    from .scenes import busy_ring, hang, nvlink_samples, straggler_job_that_ended

    topo = discover(load_preset("dgx-h100"))
    feed = {"hang": lambda: hang(8, gpu=True), "ended": straggler_job_that_ended,
            "gpus": lambda: nvlink_samples(busy_ring(16, gpu=True))}[scene]()
    src = ViewSource(feed, topo, HostTopologies(local=topo))
    got = decode(src.view(ViewQuery(focus=2, simulate=True).encode()), Fetched)
    here = feed.fetch(ViewQuery(focus=2, simulate=True), HostTopologies(local=topo))
    assert got.snap == here.snap
    if scene == "hang":
        assert got.snap.diagnoses and got.snap.alerts
    if scene == "ended":
        assert got.snap.summary is not None


def test_a_collector_is_found_by_the_address_its_ranks_use(collector, tmp_path):
    from commviz.viewlink import resolve, write_note

    _, server = collector
    addr = f"ipc://{tmp_path}/w.sock"
    with pytest.raises(ViewError, match="no collector on this machine listens on .*w.sock.*commviz serve"):
        resolve(addr)
    write_note(addr, server.url)
    assert resolve(addr) == server.url
    assert RemoteFeed(addr).fetch(ViewQuery()).snap.info.nranks == 2
    assert resolve("9400") == "http://127.0.0.1:9400" and resolve("h:1") == "http://h:1"


def test_a_collector_answering_something_else_is_said_not_raised(collector):
    feed, server = collector
    remote = RemoteFeed(server.url)

    class Odd(ViewSource):
        def view(self, query: str) -> bytes:
            return encode(ViewHello("not a snapshot"))

    server.views = Odd(feed)
    got = remote.fetch(ViewQuery())  # on the view's update thread: an exception there would freeze it
    assert got.snap is None and "answer is not a Fetched" in got.status


def test_views_asking_the_same_at_once_share_one_snapshot():
    """Ten people on one job cost the collector one snapshot a tick, not ten; a view
    asking something else (its own focus), or the next tick, gets its own."""
    from .scenes import busy_ring

    now = [100.0]
    src = ViewSource(busy_ring(16), clock=lambda: now[0])
    plain = ViewQuery().encode()
    answers = {src.view(plain) for _ in range(10)}
    assert len(answers) == 1 and src.taken == 1
    src.view(ViewQuery(focus=3).encode())
    assert src.taken == 2
    now[0] += 0.2
    src.view(plain)
    assert src.taken == 3


def test_views_with_foci_of_their_own_take_at_most_a_share_of_the_collector():
    """Forty people each focused on a rank of their own, asking at 4 Hz: no two ask the
    same, so none share. Their snapshots together must leave the collector's ingest
    the rest of its time (VIEW_SHARE); past that a view gets the latest answer to its
    own question at once (waiting in turn, forty views once timed out, 5 s), and every
    view still gets fresh ones. One view alone is never held back."""
    from commviz import viewlink

    from .scenes import busy_ring

    now = [100.0]
    feed = _costing(busy_ring(4), now, 0.040)  # a 1,024-rank snapshot
    src = ViewSource(feed, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    t0, fresh, slowest = now[0], {}, 0.0
    for tick in range(40):
        for focus in range(40):
            before, taken = now[0], src.taken
            src.view(ViewQuery(focus=focus).encode())
            slowest = max(slowest, now[0] - before)
            fresh[focus] = fresh.get(focus, 0) + (src.taken - taken)
        now[0] += 0.25
    assert src.taken * 0.040 <= viewlink.VIEW_SHARE * (now[0] - t0) + 0.040  # (the last one's rest to come)
    assert slowest <= 4 * 0.040 + 1e-9  # a first question's turn, at most
    assert src.stale > 0 and min(fresh.values()) >= 3  # everyone's picture moves, less often

    alone = ViewSource(_costing(busy_ring(4), now, 0.040), clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    for _ in range(20):
        alone.view(ViewQuery(focus=1).encode())
        now[0] += 0.25  # a view's own 4 Hz
    assert alone.waited_s == 0 and alone.stale == 0 and alone.taken == 20


def _costing(feed, now: list, cost_s: float):
    """`feed`, its `fetch` taking `cost_s` of the (fake) clock."""
    fetch = feed.fetch

    def slow(*a, **kw):
        now[0] += cost_s
        return fetch(*a, **kw)

    feed.fetch = slow
    return feed


def test_through_a_tunnel_the_given_token_gets_in_past_a_stale_one_of_this_users(tmp_path, monkeypatch):
    """`ssh -L 9400:127.0.0.1:9400 node7`, then on the laptop `COMMVIZ_TOKEN=… commviz
    watch --connect 127.0.0.1:9400`: the laptop's own collector once on that port left
    its token behind. The view and `summary --live` offer this user's token first, then
    the one given; a wrong one is refused, saying what to set."""
    from commviz.httpview import fetch_summary
    from commviz.viewlink import Refused, write_token

    private = tmp_path / "run"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(private))
    feed = busy_feed()
    server = StateServer(feed, "127.0.0.1", 0, views=ViewSource(feed), loopback_token="node7s").start()
    try:
        write_token(server.url, "left behind")
        assert RemoteFeed(server.url, token="node7s").fetch(ViewQuery()).snap is not None
        assert [r["rank"] for r in fetch_summary(server.url, "node7s")["per_rank"]] == [0, 1]
        with pytest.raises(Refused, match="set COMMVIZ_TOKEN"):
            RemoteFeed(server.url, token="a guess")
        with pytest.raises(CommvizError, match="401"):
            fetch_summary(server.url, None)
    finally:
        server.close()


def test_a_views_token_is_offered_only_where_its_collector_answered(tmp_path, monkeypatch):
    """Kept by exact loopback host and port: not offered to another port, another
    loopback address or another machine; found from a shell with XDG_RUNTIME_DIR when
    the collector kept it in the temp dir, as cron starts it."""
    import tempfile

    from commviz.viewlink import local_token, write_token

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    path = write_token("127.0.0.1:9400", "sesame")
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert local_token("http://127.0.0.1:9400") == "sesame"
    assert [local_token(u) for u in ("127.0.0.1:9401", "127.0.0.2:9400", "[::1]:9400", "10.0.0.5:9400")] == [None] * 4
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    assert local_token("127.0.0.1:9400") == "sesame"


def test_a_view_follows_its_collector_restarted_with_a_new_token(tmp_path, monkeypatch):
    """`serve --http 9400` stopped and started again makes a new view token: an open
    `watch --connect 9400` of the same user picks it up, as it picked up the
    collector itself coming back."""
    from commviz.viewlink import write_token

    private = tmp_path / "run"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(private))
    feed = busy_feed()
    first = StateServer(feed, "127.0.0.1", 0, views=ViewSource(feed), loopback_token="one")
    port = first.port
    write_token(first.url, "one")
    first.start()
    view = RemoteFeed(first.url)
    assert view.fetch(ViewQuery()).snap is not None
    first.close()
    second = StateServer(feed, "127.0.0.1", port, views=ViewSource(feed), loopback_token="two")
    write_token(second.url, "two")
    second.start()
    try:
        got = view.fetch(ViewQuery())
        assert got.snap is not None, got.status
    finally:
        second.close()

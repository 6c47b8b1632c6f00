"""The dashboard's feeds: every one answers the same interface; ReplayFeed: ordering,
speed, pause/step/seek on a fake clock, full-replay contents."""

from __future__ import annotations

from commviz.events import SCHEMA_VERSION, Batch, Counters, Goodbye, GroupDef, Hello, Mark, OpEnd, OpStart
from commviz.model.state import Model
from commviz.tui.feed import Feed, ReplayFeed, order_events

from .helpers import MS, WALL0, FakeClock, hello, two_rank_trace


def labels(feed_or_events) -> list[tuple[int, int, str]]:
    """(ms after WALL0, rank, kind[id]) for each ordered event."""
    out = []
    for t, rank, ev in feed_or_events:
        kind = type(ev).__name__
        if isinstance(ev, (OpStart, OpEnd)):
            kind += str(ev.id)
        out.append(((t - WALL0) // MS, rank, kind))
    return out


def test_order_uses_each_ranks_hello_offset_and_is_stable():
    evs = order_events(two_rank_trace(n_ops=2))
    assert labels(evs) == [
        (0, 0, "Hello"),
        (0, 0, "GroupDef"),  # untimed: applied right when reached
        (5, 1, "Hello"),
        (5, 1, "GroupDef"),
        (10, 0, "OpStart0"),
        (11, 1, "OpStart0"),
        (14, 0, "OpEnd0"),  # tie at 14 ms: input order (rank 0's batches first)
        (14, 1, "OpEnd0"),
        (20, 0, "OpStart1"),
        (21, 1, "OpStart1"),
        (24, 0, "OpEnd1"),
        (24, 1, "OpEnd1"),
    ]


def test_order_untimed_before_hello_and_rank_order_kept():
    # GroupDef before the rank's Hello takes the Hello's time; an event stamped before
    # the Hello (clock skew) is kept after it rather than reordered.
    evs = [
        GroupDef("g0", [0], "gloo"),
        hello(0, mono_ns=1000, wall_ns=WALL0 + 10 * MS, world_size=1),
        OpStart(id=0, t=1000 - 5 * MS, op="barrier", group="g0", seq=0, bytes=0),
        OpEnd(id=0, t=1000 + 2 * MS),
    ]
    out = labels(order_events([Batch(SCHEMA_VERSION, 0, evs)]))
    assert out == [(10, 0, "GroupDef"), (10, 0, "Hello"), (10, 0, "OpStart0"), (12, 0, "OpEnd0")]


def test_protocol_and_initial_state():
    clock = FakeClock()
    feed = ReplayFeed(two_rank_trace(), clock=clock)
    assert isinstance(feed, Feed)
    assert feed.now_ns() == WALL0 == feed.start_ns
    assert feed.end_ns == WALL0 + 34 * MS
    assert feed.model.events == 0  # nothing applied before the first advance
    feed.advance()
    assert feed.model.events == 2  # rank 0's Hello + GroupDef, at the start time
    assert not feed.done and not feed.paused and feed.speed == 1.0
    assert "replay trace" in feed.status() and "2/16 events" in feed.status()


def test_speed_scales_trace_time_and_is_clamped():
    clock = FakeClock()
    feed = ReplayFeed(two_rank_trace(), clock=clock)
    feed.advance()
    clock.tick(0.010)  # 10 ms at 1x
    feed.advance()
    assert feed.now_ns() == WALL0 + 10 * MS
    assert feed.position == 5  # hellos, groupdefs, rank 0's first start
    feed.set_speed(0.5)
    clock.tick(0.008)  # 4 ms of trace at 0.5x
    feed.advance()
    assert feed.now_ns() == WALL0 + 14 * MS
    assert feed.position == 8  # both ends at 14 ms are in
    feed.set_speed(100)
    assert feed.speed == 16.0
    feed.set_speed(0.0001)
    assert feed.speed == 1 / 1024  # slow enough to pace a 10 ms trace over 10 s
    feed.set_speed(1)
    feed.faster()
    assert feed.speed == 2.0
    feed.slower()
    feed.slower()
    assert feed.speed == 0.5
    # Running past the end stops at the last event.
    clock.tick(10.0)
    feed.advance()
    assert feed.done and feed.now_ns() == feed.end_ns and feed.fraction == 1.0
    assert "end" in feed.status()


def test_pause_freezes_position_and_resume_does_not_jump():
    clock = FakeClock()
    feed = ReplayFeed(two_rank_trace(), clock=clock)
    feed.advance()
    clock.tick(0.012)
    feed.pause()  # the model catches up to the pause position
    assert feed.now_ns() == WALL0 + 12 * MS and feed.position == 6
    clock.tick(5.0)
    feed.advance()
    assert feed.now_ns() == WALL0 + 12 * MS and feed.position == 6
    assert "paused" in feed.status()
    feed.resume()
    clock.tick(0.002)
    feed.advance()
    assert feed.now_ns() == WALL0 + 14 * MS and feed.position == 8
    feed.toggle_pause()
    assert feed.paused
    feed.toggle_pause()
    assert not feed.paused


def test_step_applies_exactly_the_next_op_event():
    clock = FakeClock()
    feed = ReplayFeed(two_rank_trace(n_ops=1), clock=clock)
    ev = feed.step()  # Hello/GroupDef of both ranks come along with the first OpStart
    assert feed.paused
    assert isinstance(ev, OpStart) and ev.id == 0
    assert feed.position == 5 and feed.now_ns() == WALL0 + 10 * MS
    assert feed.model.rank_rows(feed.now_ns())[0].status == "waiting"
    clock.tick(1.0)
    feed.advance()  # paused: nothing moves
    assert feed.position == 5
    # Two ends share the 14 ms stamp: each step takes exactly one.
    kinds = []
    while (ev := feed.step()) is not None:
        kinds.append((type(ev).__name__, feed.position, (feed.now_ns() - WALL0) // MS))
    assert kinds == [("OpStart", 6, 11), ("OpEnd", 7, 14), ("OpEnd", 8, 14)]
    assert feed.done and feed.step() is None
    assert feed.model.summary()["ops"][0]["count"] == 1


def test_seek_rebuilds_from_scratch():
    clock = FakeClock()
    feed = ReplayFeed(two_rank_trace(), clock=clock)
    feed.seek(1.0)
    assert feed.done and feed.model.events == 16
    assert feed.model.summary()["ops"][0]["count"] == 3
    feed.seek(0.5)  # 17 ms: ops 0 complete, nothing else started
    assert feed.now_ns() == WALL0 + 17 * MS
    assert feed.position == 8 and feed.model.events == 8 and not feed.done
    assert feed.model.summary()["ops"][0]["count"] == 1
    feed.seek_by(-10)  # clamped to the start
    assert feed.fraction == 0.0 and feed.model.events == 2
    feed.seek_by(0.5)
    assert feed.position == 8
    # Seeking does not start a paused replay, nor pause a playing one.
    feed.pause()
    feed.seek(0.0)
    clock.tick(1.0)
    feed.advance()
    assert feed.position == 2


def test_full_replay_matches_direct_ingest_exactly():
    batches = two_rank_trace(n_ops=3, nbytes=4096)
    clock = FakeClock()
    feed = ReplayFeed(batches, clock=clock, name="run.cvz")
    feed.advance()
    for _ in range(10):
        clock.tick(0.005)
        feed.advance()
    assert feed.done
    direct = Model()
    for b in batches:
        for ev in b.events:
            direct.ingest(b.rank, ev)
    direct.end_of_trace()  # the rule replay applies once its last event is in
    now = feed.now_ns()
    assert feed.model.summary(now) == direct.summary(now)
    assert feed.model.rank_rows(now) == direct.rank_rows(now)
    s = feed.model.summary(now)
    assert s["world_size"] == 2 and s["backend"] == "gloo"
    # No goodbye in this trace: at its end both ranks count as killed, as `summary` says.
    assert [r["status"] for r in s["ranks"]] == ["dead", "dead"]
    assert feed.model.ranks[0].gone_reason == "no goodbye in the trace (killed?)"
    (op,) = s["ops"]
    assert (op["op"], op["group"], op["count"], op["bytes"]) == ("all_reduce", "g0", 3, 3 * 4096)
    # Instance time is the shortest rank-side duration: rank 1 arrived last (3 ms).
    assert op["p50_us"] == op["p99_us"] == 3000.0
    assert s["per_rank"][1]["ops"] == {"all_reduce": {"count": 3, "bytes": 3 * 4096}}
    assert "run.cvz" in feed.status() and "100%" in feed.status()


def test_empty_trace():
    feed = ReplayFeed([], clock=FakeClock())
    feed.advance()
    assert feed.done and feed.now_ns() == 0 and feed.step() is None
    feed.seek(0.5)
    assert feed.model.events == 0
    assert "0/0 events" in feed.status()


def test_hello_only_trace_is_applied_at_its_wall_time():
    h = hello(0, mono_ns=5, wall_ns=WALL0, world_size=1)
    feed = ReplayFeed([Batch(SCHEMA_VERSION, 0, [h])], clock=FakeClock())
    feed.advance()
    assert feed.done and feed.now_ns() == WALL0
    assert isinstance(feed.model.ranks[0].hello, Hello)


def ring_trace(span_ms: int, n_ops: int = 4, marks: bool = True) -> list[Batch]:
    """Two ranks, `n_ops` all_reduces spread over `span_ms`, a mark before each."""
    evs = {r: [hello(r, mono_ns=0, wall_ns=WALL0), GroupDef("g0", [0, 1], "gloo")] for r in (0, 1)}
    step = span_ms * MS // n_ops
    for i in range(n_ops):
        t = i * step
        if marks:
            evs[0].append(Mark(t=t, text=f"step {i}"))
        for r in (0, 1):
            evs[r].append(OpStart(id=i, t=t + MS // 10, op="all_reduce", group="g0", seq=i, bytes=4096))
            evs[r].append(OpEnd(id=i, t=min(span_ms * MS, t + step // 2)))
    evs[0].append(Goodbye(t=span_ms * MS))
    evs[1].append(Goodbye(t=span_ms * MS))
    return [Batch(SCHEMA_VERSION, r, e) for r, e in evs.items()]


def test_a_short_trace_is_paced_to_last_about_ten_seconds():
    clock = FakeClock()
    feed = ReplayFeed(ring_trace(400), clock=clock, speed=None, name="t.cvz")
    assert feed.end_ns - feed.start_ns == 400 * MS
    assert feed.speed == 0.04
    assert "0.04× (a 400ms trace in ~10 s)" in feed.status()
    feed.advance()
    for _ in range(99):  # 9.9 s of wall time
        clock.tick(0.1)
        feed.advance()
    assert not feed.done and feed.fraction > 0.95
    clock.tick(0.1)
    feed.advance()
    assert feed.done
    # A long trace plays at 1x; an explicit speed is kept.
    assert ReplayFeed(ring_trace(20_000), clock=clock, speed=None).speed == 1.0
    assert ReplayFeed(ring_trace(400), clock=clock, speed=2).speed == 2.0


def test_step_forward_and_back_op_by_op():
    clock = FakeClock()
    feed = ReplayFeed(ring_trace(400), clock=clock)
    first = feed.step()
    assert isinstance(first, OpStart) and first.id == 0 and feed.paused
    second = feed.step()
    assert isinstance(second, OpStart) and feed.model.pending  # both ranks inside all_reduce #0
    n, pos = feed.position, feed.now_ns()
    assert feed.step_back() is second
    assert feed.position == n - 1 and feed.now_ns() <= pos
    assert feed.step() is second and feed.position == n  # and forward again to the same state
    while feed.step_back() is not None:
        pass
    assert feed.model.events < 6 and feed.now_ns() == feed.start_ns  # before the first op: hellos and marks


def test_timeline_has_the_marks_and_the_diagnoses_and_seeks_to_them():
    from commviz.model.diagnosis import Kind

    clock = FakeClock()
    feed = ReplayFeed(ring_trace(400), clock=clock)
    assert feed.timeline_done.wait(10)
    tl = feed.timeline
    assert [k.text for k in tl.ticks] == ["step 0", "step 1", "step 2", "step 3"]
    feed.seek_tick(forward=True)  # "step 0" is where the trace starts: the next is "step 1"
    assert feed.now_ns() == WALL0 + 100 * MS
    assert feed.model.marks[-1][2] == "step 1"
    feed.seek_tick(forward=False)
    assert feed.now_ns() == WALL0  # "step 0"
    # A rank that never enters all_reduce #1: a hang, placed where #1 began.
    batches = ring_trace(400, n_ops=2, marks=False)
    batches[1].events = [e for e in batches[1].events if not (isinstance(e, (OpStart, OpEnd)) and e.id == 1)]
    batches[0].events = [e for e in batches[0].events if not (isinstance(e, OpEnd) and e.id == 1)]
    for b in batches:  # no goodbyes: the job was stopped 20 s in, rank 0 still waiting
        b.events[-1] = Counters(t=20_000 * MS)
    replay = ReplayFeed(batches, clock=clock)
    assert replay.timeline_done.wait(10)  # found on a thread: a big trace opens at once
    hang = replay.timeline
    assert [k.kind for k in hang.ticks] == [Kind.HANG]
    assert hang.ticks[0].t == WALL0 + 200 * MS + MS // 10 and "never entered" in hang.ticks[0].text


def test_playback_starts_at_the_first_advance_not_at_construction():
    """The dashboard's start-up (a second or more) must not eat the start of a paced trace."""
    clock = FakeClock()
    feed = ReplayFeed(ring_trace(400), clock=clock, speed=None)
    clock.tick(2.0)
    feed.advance()
    assert feed.now_ns() == feed.start_ns
    clock.tick(1.0)
    feed.advance()
    assert feed.now_ns() == feed.start_ns + 40 * MS


def test_every_feed_answers_the_dashboards_one_interface(tmp_path):
    """Live, remote, replay and attach: the same methods, each a no-op where the feed
    has nothing to do, and replay's controls only on a replay; so the app draws any
    of them without asking which it has."""
    from commviz.attach.feed import AttachFeed
    from commviz.httpview import StateServer
    from commviz.view.feed import ViewQuery
    from commviz.view.snapshot import Fetched
    from commviz.viewlink import RemoteFeed, ViewSource
    from commviz.watcher import LiveFeed

    from .scenes import busy_ring

    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    collector = busy_ring(4)
    server = StateServer(collector, "127.0.0.1", 0, views=ViewSource(collector)).start()
    feeds = {"live": LiveFeed(f"ipc://{d}/w.sock"), "remote": RemoteFeed(server.url),
             "replay": ReplayFeed(two_rank_trace(), clock=FakeClock()),
             "attach": AttachFeed(lambda: (Model(), {}))}
    try:
        for name, feed in feeds.items():
            assert isinstance(feed, Feed), name
            got = feed.fetch(ViewQuery())
            assert isinstance(got, Fetched) and got.snap is not None and got.status, name
            feed.note_stop("commviz watch", "quit while it ran")
            assert (feed.replay is feed) == (name == "replay"), name
        assert feeds["remote"].fetch(ViewQuery()).info.nranks == 4
    finally:
        for feed in feeds.values():
            feed.close()
        server.close()

"""The replay timeline: marks and diagnoses on a bar under the flow view, the
playhead, seeking by click and by key, stepping op by op both ways."""

from __future__ import annotations

from commviz.tui.app import WatchApp
from commviz.tui.feed import ReplayFeed
from commviz.tui.widgets.timeline import TimelineBar, timeline_text

from .helpers import MS, WALL0, FakeClock
from .test_feed import ring_trace


def test_bar_has_the_marks_the_playhead_and_what_it_passed():
    feed = ReplayFeed(ring_trace(400), clock=FakeClock())
    feed.seek(0.3)
    bar, under = timeline_text(feed.timeline, feed.now_ns(), 61).plain.split("\n")
    assert len(bar) == 61 and bar.count("◆") == 4 and bar[18] == "●"  # 30% of 60 cells
    assert set(bar[:18]) <= {"━", "◆"} and set(bar[19:]) <= {"─", "◆"}  # played, then to come
    assert under.startswith("120ms / 400ms  step 1") and under.endswith("n b step")


async def test_click_and_keys_seek_and_step():
    clock = FakeClock()
    feed = ReplayFeed(ring_trace(400), clock=clock, name="run.cvz", speed=None)
    app = WatchApp(feed, title="replay", clock=clock)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        timeline = app.query_one("#timeline", TimelineBar)
        assert timeline.display and timeline.timeline is feed.timeline
        assert "0.04× (a 400ms trace in ~10 s)" in feed.status()
        width = timeline.content_region.width
        x = round(0.6 * (width - 1))
        await pilot.click("#timeline", offset=(1 + x, 0))  # 1: the padding
        await pilot.pause()
        assert feed.now_ns() == WALL0 + round(x / (width - 1) * 400 * MS)  # about 240 ms
        await pilot.press("space", "full_stop")  # pause; the next mark: "step 3" at 300 ms
        assert feed.now_ns() == WALL0 + 300 * MS and feed.model.marks[-1][2] == "step 3"
        await pilot.press("comma")
        assert feed.now_ns() == WALL0 + 200 * MS
        await pilot.press("n")
        n = feed.position
        await pilot.press("b")
        assert feed.position == n - 1 and feed.paused
        await pilot.pause()
        assert "step 2" in str(timeline.render())


async def test_no_timeline_on_a_live_feed():
    from .scenes import busy_ring

    app = WatchApp(busy_ring(4), title="live", clock=FakeClock(), animate=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert not app.query_one("#timeline", TimelineBar).display
        assert app.check_action("step_back", ()) is False

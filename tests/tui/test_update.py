"""The data clock off the UI thread: snapshots are taken on the update thread and
posted; one taken before a key press never paints over it; the diagnoses are
computed once per snapshot."""

from __future__ import annotations

import asyncio
import threading

from textual.widgets import DataTable

from commviz.tui.app import WatchApp
from commviz.view.snapshot import take_snapshot

from . import scenes
from .helpers import FakeClock


class ThreadNoting(scenes.FakeFeed):
    """Remembers which threads advanced it."""

    def __init__(self, inner: scenes.FakeFeed) -> None:
        super().__init__(inner.now)
        self.model = inner.model
        self.threads: set[str] = set()

    def advance(self) -> None:
        super().advance()
        self.threads.add(threading.current_thread().name)


async def test_ticks_take_the_snapshot_on_the_update_thread():
    feed = ThreadNoting(scenes.busy_ring(4, ops=10))
    app = WatchApp(feed, title="t", clock=FakeClock(), refresh_hz=50, table_every=1)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        ops = app.query_one("#ops", DataTable)
        assert ops.get_cell("all_reduce@0", "count").plain == "10"
        with feed.lock:
            feed.model = scenes.busy_ring(4, ops=20).model
        for _ in range(100):  # no refresh_view here: only the timer and the thread
            await asyncio.sleep(0.02)
            await pilot.pause()
            if ops.get_cell("all_reduce@0", "count").plain == "20":
                break
        assert ops.get_cell("all_reduce@0", "count").plain == "20"
        assert "commviz-snapshot" in feed.threads


async def test_a_snapshot_taken_before_a_key_press_is_dropped():
    feed = scenes.busy_ring(4, ops=10)
    app = WatchApp(feed, title="t", clock=FakeClock(), refresh_hz=0.01)  # the timer stays out of it
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        ops = app.query_one("#ops", DataTable)
        stale_number = next(app._numbers)
        stale = app._fetch()  # what the update thread would have taken
        with feed.lock:
            feed.model = scenes.busy_ring(4, ops=20).model
        app.refresh_view()  # a key press: drawn at once
        app._draw(stale, stale_number, tables=True)  # the thread's older snapshot arrives late
        await pilot.pause()
        assert ops.get_cell("all_reduce@0", "count").plain == "20"


def test_diagnoses_once_per_snapshot():
    feed = scenes.hang(8, missing=5)
    m = feed.model
    calls = []
    real = m.findings
    m.findings = lambda now=None: calls.append(now) or real(now)
    snap = take_snapshot(m, feed.now)
    assert len(calls) == 1
    assert snap.diagnoses and [r.status for r in snap.rank_rows if r.rank == 5] == ["missing"]
